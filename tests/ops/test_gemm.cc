// GEMM against a float64 reference: every transpose combination, beta 0/1, odd shapes, bf16,
// batched, grouped (with empty groups), determinism across runs and thread counts, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "ops/gradcheck.h"
#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/amx_gemm.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;

// C = alpha·op(A)·op(B) + beta·C in double, row-major, batch-major; B may be shared over the batch.
std::vector<double> gemm_reference(const std::vector<double>& a, Trans ta, const std::vector<double>& b,
                                   Trans tb, std::vector<double> c, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, double alpha, double beta, bool shared_b = false) {
  for (int64_t z = 0; z < batch; ++z) {
    const double* A = a.data() + z * m * k;
    const double* B = b.data() + (shared_b ? 0 : z * k * n);
    double* C = c.data() + z * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          double av = ta == Trans::N ? A[i * k + p] : A[p * m + i];
          double bv = tb == Trans::N ? B[p * n + j] : B[j * k + p];
          s += av * bv;
        }
        C[i * n + j] = alpha * s + beta * C[i * n + j];
      }
  }
  return c;
}

Shape operand_shape(int64_t rows, int64_t cols, Trans t) {
  return t == Trans::N ? Shape{rows, cols} : Shape{cols, rows};
}

struct Dims {
  int64_t m, n, k;
};

class GemmF32 : public ::testing::TestWithParam<std::tuple<Dims, Trans, Trans, float>> {};

TEST_P(GemmF32, MatchesFloat64Reference) {
  auto [d, ta, tb, beta] = GetParam();
  Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 1);
  Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 2);
  Tensor C = random_tensor({d.m, d.n}, 3);
  auto ref = gemm_reference(to_f64(A), ta, to_f64(B), tb, to_f64(C), 1, d.m, d.n, d.k, 0.75, beta);
  gemm(A, ta, B, tb, C, 0.75f, beta);
  // f32 products summed over K <= 64 terms: rounding grows like sqrt(K)·2^-24 (~5e-7) in norm;
  // 1e-5 leaves a 20x margin and still catches any indexing or transpose mistake (errors O(1)).
  EXPECT_LT(test::rel_error(C, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmF32,
    ::testing::Combine(::testing::Values(Dims{1, 1, 1}, Dims{5, 17, 3}, Dims{64, 48, 33}, Dims{7, 13, 64}),
                       ::testing::Values(Trans::N, Trans::T), ::testing::Values(Trans::N, Trans::T),
                       ::testing::Values(0.0f, 1.0f)));

TEST(Gemm, Bf16InputsAccumulateInF32) {
  for (Dims d : {Dims{1, 1, 1}, Dims{5, 17, 3}, Dims{64, 48, 33}}) {
    for (Trans ta : {Trans::N, Trans::T}) {
      for (Trans tb : {Trans::N, Trans::T}) {
        Tensor Af = random_tensor(operand_shape(d.m, d.k, ta), 11);
        Tensor Bf = random_tensor(operand_shape(d.k, d.n, tb), 12);
        Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 11, 1.0f, DType::bf16);  // same values, rounded
        Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 12, 1.0f, DType::bf16);
        Tensor C = random_tensor({d.m, d.n}, 13);
        auto c0 = to_f64(C);
        gemm(A, ta, B, tb, C, 1.0f, 1.0f);
        // (1) On the bf16-rounded inputs (exact in double) only the f32 accumulation differs:
        // same 1e-5 bound as the f32 test.
        auto exact = gemm_reference(to_f64(A), ta, to_f64(B), tb, c0, 1, d.m, d.n, d.k, 1, 1);
        EXPECT_LT(test::rel_error(C, exact), 1e-5);
        // (2) Against the unrounded f32 inputs: each input carries relative rounding <= 2^-8, so each
        // product is off by <= (2·2^-8 + 2^-16)|a||b|; bound elementwise by that times sum|a||b|,
        // plus 1e-5·(sum|a||b| + |c0|) for the f32 accumulation.
        auto absA = to_f64(Af), absB = to_f64(Bf);
        for (auto& x : absA) x = std::fabs(x);
        for (auto& x : absB) x = std::fabs(x);
        auto mag =
            gemm_reference(absA, ta, absB, tb, std::vector<double>(c0.size(), 0.0), 1, d.m, d.n, d.k, 1, 0);
        auto ref = gemm_reference(to_f64(Af), ta, to_f64(Bf), tb, c0, 1, d.m, d.n, d.k, 1, 1);
        auto got = to_f64(C);
        double u = std::ldexp(1.0, -8);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::fabs(got[i] - ref[i]), (2 * u + u * u) * mag[i] + 1e-5 * (mag[i] + std::fabs(c0[i])))
              << "element " << i << " of " << d.m << "x" << d.n << "x" << d.k;
      }
    }
  }
}

TEST(Gemm, BatchedAndBroadcastB) {
  const int64_t z = 3, m = 5, n = 4, k = 7;
  for (bool shared : {false, true}) {
    Tensor A = random_tensor({z, k, m}, 21);  // Trans::T
    Tensor B = shared ? random_tensor({k, n}, 22) : random_tensor({z, k, n}, 22);
    Tensor C = random_tensor({z, m, n}, 23);
    auto ref = gemm_reference(to_f64(A), Trans::T, to_f64(B), Trans::N, to_f64(C), z, m, n, k, 1, 1, shared);
    gemm(A, Trans::T, B, Trans::N, C, 1.0f, 1.0f);
    // Same f32 accumulation bound as above (K = 7).
    EXPECT_LT(test::rel_error(C, ref), 1e-5) << "shared B: " << shared;
  }
}

TEST(Gemm, GroupedWithEmptyGroups) {
  const int64_t n = 9, k = 13;
  std::vector<int64_t> ms = {0, 3, 17, 0, 1};
  std::vector<GemmProblem> problems;
  std::vector<std::vector<double>> refs;
  for (size_t g = 0; g < ms.size(); ++g) {
    Tensor A = ms[g] ? random_tensor({ms[g], k}, 30 + g) : Tensor::empty({0, k}, DType::f32);
    Tensor B = random_tensor({n, k}, 40 + g);  // used transposed, like the [out, in] expert weights
    Tensor C = ms[g] ? random_tensor({ms[g], n}, 50 + g) : Tensor::empty({0, n}, DType::f32);
    refs.push_back(gemm_reference(to_f64(A), Trans::N, to_f64(B), Trans::T, to_f64(C), 1, ms[g], n, k, 1, 1));
    problems.push_back({A, B, C});
  }
  gemm_grouped(problems, Trans::N, Trans::T, 1.0f, 1.0f);
  for (size_t g = 0; g < ms.size(); ++g) {
    EXPECT_EQ(problems[g].C.numel(), ms[g] * n);
    if (ms[g]) {
      EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5) << "group " << g;  // f32, K = 13
    }
  }
}

// Bitwise equality of two f32 tensors.
bool same_bits(const Tensor& a, const Tensor& b) {
  // (memcmp may not be given the null data pointer of an empty tensor, even for 0 bytes)
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// The grouped expert GEMMs with token counts that change from group to group and call to call, in
// the three forms the MoE layer uses (x·Wᵀ, dy·W, and dW += dyᵀ·x with the tokens as the
// reduction dim), f32 and bf16. The counts cover the bf16 path's row blocks (kRowBlock = 32 in
// gemm_grouped.cc): below one block, exact blocks, a block plus a tail, several blocks plus a tail.
struct GroupedForm {
  Trans ta, tb;
  float beta;
};

// One grouped call's problems in form f with token counts ms (expert weight [n, k]) and their
// float64 references: x·Wᵀ: A [m, k], B [n, k];  dy·W: A [m, n], B [n, k];  dyᵀ·x: A [m, n],
// B [m, k], C [n, k]. Seeds run from seed + 1 up.
struct GroupedCase {
  std::vector<GemmProblem> problems;
  std::vector<std::vector<double>> refs;
};
GroupedCase make_grouped_case(GroupedForm f, const std::vector<int64_t>& ms, int64_t n, int64_t k, DType dt,
                              uint64_t seed) {
  GroupedCase g;
  for (int64_t m : ms) {
    Shape a_shape = f.ta == Trans::T || f.tb == Trans::N ? Shape{m, n} : Shape{m, k};
    Shape b_shape = f.ta == Trans::T ? Shape{m, k} : Shape{n, k};
    Shape c_shape = f.ta == Trans::T ? Shape{n, k} : (f.tb == Trans::N ? Shape{m, k} : Shape{m, n});
    Tensor A = random_tensor(a_shape, ++seed, 1.0f, dt), B = random_tensor(b_shape, ++seed, 1.0f, dt);
    Tensor C = random_tensor(c_shape, ++seed);
    int64_t rm = c_shape[0], rn = c_shape[1], rk = f.ta == Trans::T ? m : a_shape[1];
    g.refs.push_back(gemm_reference(to_f64(A), f.ta, to_f64(B), f.tb, to_f64(C), 1, rm, rn, rk, 1, f.beta));
    g.problems.push_back({A, B, C});
  }
  return g;
}

TEST(Gemm, GroupedVaryingTokenCountsMatchReference) {
  const int64_t n = 24, k = 40;  // the expert weight's dims
  const std::vector<std::vector<int64_t>> routings = {{0, 1, 31, 32}, {33, 64, 0, 100}, {7, 97, 65, 2}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (GroupedForm f : {GroupedForm{Trans::N, Trans::T, 0.0f}, GroupedForm{Trans::N, Trans::N, 0.0f},
                          GroupedForm{Trans::T, Trans::N, 1.0f}}) {
      uint64_t seed = 100;
      for (const auto& ms : routings) {
        auto [problems, refs] = make_grouped_case(f, ms, n, k, dt, seed);
        seed += 3 * ms.size();
        gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
        for (size_t g = 0; g < ms.size(); ++g) {
          if (problems[g].C.numel() == 0) continue;
          // Exact bf16/f32 inputs, f32 accumulation over <= 100 terms: ~sqrt(100)·2^-24 in norm;
          // 1e-5 as in the tests above.
          EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5)
              << dtype_name(dt) << " ta " << int(f.ta) << " tb " << int(f.tb) << " m " << ms[g];
        }
      }
    }
  }
}

// With a large expert weight (N·K >= 2^20 in gemm_grouped.cc) the paths swap: bf16 takes the runtime-M
// primitive and f32 the row blocks. Check both, with counts on both sides of a row block.
// The model's layout: every expert's tokens are consecutive rows of one A buffer and one C buffer.
// With beta = 0 a problem then runs as M rounded up to whole row blocks in place (gemm_grouped.cc,
// may_run_past_end): its extra rows read the next expert's tokens and write rows that the next
// problem overwrites. Every problem must still equal its own reference, and C's rows after the
// last problem (spare capacity, as in the model's buffers) must be left alone. Both row-blocked
// cases: bf16 with a small weight and f32 with a large one.
TEST(Gemm, GroupedConsecutiveRowsRunPastEndsSafely) {
  struct Case {
    DType dt;
    int64_t n, k;
  };
  for (Case c : {Case{DType::bf16, 48, 40}, Case{DType::f32, 1024, 1024}}) {
    const std::vector<int64_t> ms = {45, 30, 0, 70, 33, 40, 29};  // 45, 70, 33 and 40 run past their ends
    int64_t total = 0;
    for (int64_t m : ms) total += m;
    const int64_t spare = 40;  // rows past the last problem, which must stay as they were
    Tensor A = random_tensor({total + spare, c.k}, 300, 1.0f, c.dt);
    Tensor W = random_tensor({static_cast<int64_t>(ms.size()), c.n, c.k}, 301, 1.0f, c.dt);
    Tensor C = random_tensor({total + spare, c.n}, 302);
    std::vector<float> spare_before(C.data<float>() + total * c.n, C.data<float>() + (total + spare) * c.n);
    std::vector<GemmProblem> problems;
    std::vector<std::vector<double>> refs;
    int64_t off = 0;
    for (size_t e = 0; e < ms.size(); ++e) {
      Tensor Ae = A.slice(off, off + ms[e]), We = W.select(static_cast<int64_t>(e)), Ce = C.slice(off, off + ms[e]);
      refs.push_back(gemm_reference(to_f64(Ae), Trans::N, to_f64(We), Trans::T, to_f64(Ce), 1, ms[e], c.n, c.k, 1, 0));
      problems.push_back({Ae, We, Ce});
      off += ms[e];
    }
    gemm_grouped(problems, Trans::N, Trans::T);
    for (size_t e = 0; e < ms.size(); ++e)
      if (ms[e]) {
        // Exact inputs, f32 accumulation over K ≤ 1024 terms: ≤ ~2e-6 in norm (as above).
        EXPECT_LT(test::rel_error(problems[e].C, refs[e]), 1e-5) << dtype_name(c.dt) << " expert " << e;
      }
    for (int64_t i = 0; i < spare * c.n; ++i)
      ASSERT_EQ(C.data<float>()[total * c.n + i], spare_before[static_cast<size_t>(i)])
          << dtype_name(c.dt) << ": spare row " << i / c.n << " was written";
  }
}
TEST(Gemm, GroupedLargeWeightMatchesReference) {
  const int64_t n = 1024, k = 1024;
  const std::vector<int64_t> ms = {5, 0, 37};
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<GemmProblem> problems;
    std::vector<std::vector<double>> refs;
    for (size_t g = 0; g < ms.size(); ++g) {
      Tensor A = random_tensor({ms[g], k}, 140 + g, 1.0f, dt), B = random_tensor({n, k}, 150 + g, 1.0f, dt);
      Tensor C = random_tensor({ms[g], n}, 160 + g);
      refs.push_back(
          gemm_reference(to_f64(A), Trans::N, to_f64(B), Trans::T, to_f64(C), 1, ms[g], n, k, 1, 1));
      problems.push_back({A, B, C});
    }
    gemm_grouped(problems, Trans::N, Trans::T, 1.0f, 1.0f);
    for (size_t g = 0; g < ms.size(); ++g)
      if (ms[g]) {
        // Exact inputs, f32 accumulation over K = 1024: ~sqrt(1024)·2^-24 ≈ 2e-6 in norm.
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5) << dtype_name(dt) << " group " << g;
      }
  }
}

// The bf16 weight gradient dW += dyᵀ·x with a large dW (M·N >= 2^20 in gemm_grouped.cc) runs on zaya's
// AMX kernel where the CPU has one, and otherwise on oneDNN: with the token dim K zero-padded to a
// multiple of 32 where oneDNN has AMX, at a runtime K elsewhere. Every path (the oneDNN ones
// forced by gemm_use_amx(false) and gemm_force_bf16_fixed_shapes), with token counts below, at
// and above a multiple of 32, against float64 and bitwise between 2 threads and 1.
TEST(Gemm, GroupedBf16LargeWeightGradientMatchesReference) {
  const int64_t n_out = 1024, n_in = 1024;
  const std::vector<int64_t> tokens = {5, 0, 32, 37};
  const int saved = num_threads();
  for (auto [amx, fixed] : {std::pair{true, false}, std::pair{false, false}, std::pair{false, true}}) {
    std::vector<std::vector<Tensor>> outs;  // on 2 threads, then 1: the same bits
    for (int threads : {2, 1}) {
      set_num_threads(threads);
      gemm_use_amx(amx);
      gemm_force_bf16_fixed_shapes(fixed);
      std::vector<GemmProblem> problems;
      std::vector<std::vector<double>> refs;
      for (size_t g = 0; g < tokens.size(); ++g) {
        Tensor dy = random_tensor({tokens[g], n_out}, 170 + g, 1.0f, DType::bf16);
        Tensor x = random_tensor({tokens[g], n_in}, 180 + g, 1.0f, DType::bf16);
        Tensor dW = random_tensor({n_out, n_in}, 190 + g);
        refs.push_back(gemm_reference(to_f64(dy), Trans::T, to_f64(x), Trans::N, to_f64(dW), 1, n_out, n_in,
                                      tokens[g], 1, 1));
        problems.push_back({dy, x, dW});
      }
      gemm_grouped(problems, Trans::T, Trans::N, 1.0f, 1.0f);
      outs.emplace_back();
      for (size_t g = 0; g < tokens.size(); ++g) {
        // Exact bf16 inputs, f32 accumulation over <= 37 terms plus the old dW: 1e-5 as above.
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5)
            << "group " << g << (amx ? " (AMX allowed)" : "") << (fixed ? " (fixed shapes)" : "");
        outs.back().push_back(problems[g].C);
      }
    }
    for (size_t g = 0; g < tokens.size(); ++g)
      EXPECT_TRUE(same_bits(outs[0][g], outs[1][g]))
          << "group " << g << (amx ? " (AMX allowed)" : "") << (fixed ? " (fixed shapes)" : "");
  }
  set_num_threads(saved);
  gemm_use_amx(true);
  gemm_force_bf16_fixed_shapes(false);
}

// A new token count must not build a new primitive (0.4–2 ms each): with a small weight, f32
// groups share one runtime-M primitive per form, bf16 groups one per whole-32-row body plus one
// for the padded tail. 40 calls with fresh counts in [1, 200]: f32 builds nothing after the first call,
// bf16 at most 200/32 + 1 = 7 primitives in all.
TEST(Gemm, GroupedTokenCountsDoNotBuildAPrimitiveEach) {
  const int64_t n = 16, k = 24;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor W = random_tensor({n, k}, 7, 1.0f, dt);
    int64_t first_misses = 0;
    GemmCacheStats start = gemm_cache_stats();
    for (int call = 0; call < 40; ++call) {
      int64_t m = 1 + (call * 37 + 11) % 200;
      std::vector<GemmProblem> p = {
          {random_tensor({m, k}, 8 + call, 1.0f, dt), W, Tensor::empty({m, n}, DType::f32)}};
      gemm_grouped(p, Trans::N, Trans::T);
      if (call == 0) first_misses = gemm_cache_stats().misses - start.misses;
    }
    int64_t misses = gemm_cache_stats().misses - start.misses;
    if (dt == DType::f32) {
      EXPECT_EQ(misses, first_misses) << "f32 built a primitive for a new token count";
    } else {
      EXPECT_LE(misses, 200 / 32 + 1) << "bf16";
    }
  }
}

// Grouped products with the tokens in M on 2 threads give the one-thread bits, whatever the token
// counts. oneDNN's own threading of the runtime-M kernel did not: f32 x·Wᵀ with K = 1024 and a
// small weight differed at every M ≥ 16, and dy·W with one row (an expert that got one token; in
// bf16 with a large weight, 4096 × 256), until gemm_grouped.cc ran such products as row pieces on
// one thread each. The uneven token counts keep the call from running side by side (one problem
// per thread).
TEST(Gemm, GroupedRowProductsAreThreadCountFree) {
  const int saved = num_threads();
  struct Case {
    DType dt;
    int64_t k, n;
  };
  for (Trans tb : {Trans::N, Trans::T})
    for (Case cs : {Case{DType::f32, 256, 512}, Case{DType::f32, 1024, 256}, Case{DType::f32, 2048, 256},
                    Case{DType::f32, 64, 48}, Case{DType::bf16, 4096, 256}}) {
      const int64_t k = cs.k, n = cs.n;
      SCOPED_TRACE(std::string(dtype_name(cs.dt)) + " K " + std::to_string(k) + " N " + std::to_string(n) +
                   (tb == Trans::N ? " dy·W" : " x·Wᵀ"));
      const std::vector<int64_t> rows = {1, 2035, 12, 1, 3, 7, 20, 300};
      std::vector<Tensor> a, b;
      for (size_t e = 0; e < rows.size(); ++e) {
        a.push_back(random_tensor({rows[e], k}, 11 + e, 1.0f, cs.dt));
        b.push_back(random_tensor(tb == Trans::N ? Shape{k, n} : Shape{n, k}, 31 + e, 1.0f, cs.dt));
      }
      std::vector<std::vector<float>> out;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<GemmProblem> problems;
        std::vector<Tensor> c;
        for (size_t e = 0; e < rows.size(); ++e) {
          c.push_back(Tensor::empty({rows[e], n}, DType::f32));
          problems.push_back({a[e], b[e], c.back()});
        }
        gemm_grouped(problems, Trans::N, tb);
        out.emplace_back();
        for (const Tensor& t : c)
          out.back().insert(out.back().end(), t.data<float>(), t.data<float>() + t.numel());
      }
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4));
    }
  set_num_threads(saved);
}

TEST(Gemm, GroupedExpertsSideBySideMatchReferenceAndOneThreadBitwise) {
  // Eight experts on 2 threads run side by side, whole GEMMs or row halves taken by the threads
  // in turn (gemm_grouped.cc, split_problems); each must be right, and bit-identical to the same call on 1
  // thread (where they run one after another). bf16 with these small weights runs on the AMX
  // kernel where the CPU has one (x·Wᵀ and dy·W need K a multiple of 32 for it: here only dyᵀ·x
  // does), side by side too; otherwise on oneDNN, in row blocks where it has AMX and at a runtime M
  // elsewhere: both are run here (the first forced by gemm_force_bf16_fixed_shapes).
  const int saved = num_threads();
  // Three experts of >= 128 tokens: in f32 x·Wᵀ and dy·W those run as two row halves each on 2
  // threads (gemm_grouped.cc, grouped_items), whole on 1.
  const std::vector<int64_t> ms = {161, 47, 70, 52, 130, 58, 44, 136};
  const int64_t n = 48, k = 80;
  for (bool fixed : {false, true}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      if (fixed && dt == DType::f32) continue;  // the switch only moves bf16 calls
      for (GroupedForm f : {GroupedForm{Trans::N, Trans::T, 0.0f}, GroupedForm{Trans::N, Trans::N, 1.0f},
                            GroupedForm{Trans::T, Trans::N, 1.0f}}) {
        std::vector<std::vector<Tensor>> outs;
        for (int threads : {2, 1, 2}) {
          set_num_threads(threads);
          auto [problems, refs] = make_grouped_case(f, ms, n, k, dt, 900);
          gemm_force_bf16_fixed_shapes(fixed);
          gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
          gemm_force_bf16_fixed_shapes(false);
          outs.emplace_back();
          for (size_t g = 0; g < ms.size(); ++g) {
            // f32 accumulation over <= 80 terms of exact products: 1e-5 as in the tests above.
            EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5)
                << dtype_name(dt) << " ta " << int(f.ta) << " tb " << int(f.tb) << " expert " << g;
            outs.back().push_back(problems[g].C);
          }
        }
        for (size_t r = 1; r < outs.size(); ++r)
          for (size_t g = 0; g < ms.size(); ++g)
            EXPECT_TRUE(same_bits(outs[0][g], outs[r][g]))
                << dtype_name(dt) << (fixed ? " fixed shapes" : "") << " run " << r << " expert " << g;
      }
    }
  }
  set_num_threads(saved);
}

// Large bf16 expert weights (N·K >= 2^20) in x·Wᵀ and dy·W run side by side where oneDNN has no
// AMX (gemm_grouped.cc, split_problems) and one after another on every thread where it has: against
// float64, and bitwise between 2 threads and 1 on this CPU's path.
TEST(Gemm, GroupedBf16LargeWeightsMatchReferenceAndOneThreadBitwise) {
  const int saved = num_threads();
  const std::vector<int64_t> ms = {20, 17, 23, 19};
  const int64_t n = 1024, k = 1024;
  for (GroupedForm f : {GroupedForm{Trans::N, Trans::T, 0.0f}, GroupedForm{Trans::N, Trans::N, 1.0f}}) {
    std::vector<std::vector<Tensor>> outs;
    for (int threads : {2, 1}) {
      set_num_threads(threads);
      auto [problems, refs] = make_grouped_case(f, ms, n, k, DType::bf16, 990);
      gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
      outs.emplace_back();
      for (size_t g = 0; g < ms.size(); ++g) {
        // Exact bf16 inputs, f32 accumulation over 1024 terms: ~sqrt(1024)·2^-24 ≈ 2e-6 in norm.
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5) << "tb " << int(f.tb) << " expert " << g;
        outs.back().push_back(problems[g].C);
      }
    }
    for (size_t g = 0; g < ms.size(); ++g)
      EXPECT_TRUE(same_bits(outs[0][g], outs[1][g])) << "tb " << int(f.tb) << " expert " << g;
  }
  set_num_threads(saved);
}

TEST(Gemm, GroupedProblemsSharingAnOutputAccumulateInOrder) {
  // Four weight-gradient problems adding into ONE C (beta = 1), as gradient accumulation over
  // micro-batches could: they must not run side by side (two threads adding into the same C lose
  // updates), and after `calls` calls C holds C0 + calls · Σ_g A_gᵀ·B_g. Small token counts and
  // a larger C make the additions into C a large part of each product, so a race would show: with
  // the overlap check in gemm_grouped.cc's split_problems removed, this failed in 1 to 2 of 5 runs.
  const int saved = num_threads();
  set_num_threads(2);
  const int64_t n = 384, k = 384, calls = 50;
  const std::vector<int64_t> tokens = {16, 15, 17, 16};
  Tensor C = random_tensor({n, k}, 950);
  std::vector<double> c0 = to_f64(C), sum(static_cast<size_t>(n * k), 0.0);
  std::vector<GemmProblem> problems;
  for (size_t g = 0; g < tokens.size(); ++g) {
    Tensor A = random_tensor({tokens[g], n}, 960 + g), B = random_tensor({tokens[g], k}, 970 + g);
    std::vector<double> a = to_f64(A), b = to_f64(B);
    for (int64_t t = 0; t < tokens[g]; ++t)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) sum[i * k + j] += a[t * n + i] * b[t * k + j];  // dyᵀ·x
    problems.push_back({A, B, C});
  }
  for (int64_t c = 0; c < calls; ++c) gemm_grouped(problems, Trans::T, Trans::N, 1.0f, 1.0f);
  set_num_threads(saved);
  std::vector<double> want(c0.size());
  for (size_t e = 0; e < want.size(); ++e) want[e] = c0[e] + static_cast<double>(calls) * sum[e];
  // f32 sums of ~1300 terms of O(1) per element: ~1e-6 relative in norm; a lost update is ~1/80 of
  // the total. 1e-5.
  EXPECT_LT(test::rel_error(C, want), 1e-5);
}

TEST(Gemm, GroupedDeterministicAcrossThreadCounts) {
  int saved = num_threads();
  const int64_t n = 48, k = 96;
  const std::vector<int64_t> ms = {45, 0, 130, 3};
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Tensor> As, Bs;
    for (size_t g = 0; g < ms.size(); ++g) {
      As.push_back(random_tensor({ms[g], k}, 80 + g, 1.0f, dt));
      Bs.push_back(random_tensor({n, k}, 90 + g, 1.0f, dt));
    }
    std::vector<std::vector<Tensor>> outs;
    for (int threads : {1, 2, 2, 1}) {
      set_num_threads(threads);
      std::vector<GemmProblem> p;
      for (size_t g = 0; g < ms.size(); ++g)
        p.push_back({As[g], Bs[g], Tensor::zeros({ms[g], n}, DType::f32)});
      gemm_grouped(p, Trans::N, Trans::T);
      outs.emplace_back();
      for (auto& q : p) outs.back().push_back(q.C);
    }
    for (size_t r = 1; r < outs.size(); ++r)
      for (size_t g = 0; g < ms.size(); ++g)
        EXPECT_TRUE(same_bits(outs[0][g], outs[r][g])) << dtype_name(dt) << " group " << g << " run " << r;
  }
  set_num_threads(saved);
}

// The bf16 grouped calls that fit zaya's AMX kernel (ops/cpu/amx_gemm.h: small weights, N a
// multiple of 16, K of 32 for x·Wᵀ and dy·W) in the three MoE forms, with token counts that hit
// the kernel's 32-row blocks and their tails, against float64 and with the AMX switch off
// (oneDNN). On an AMX CPU the AMX calls must build no oneDNN primitive (so the path really ran).
// On 2 threads these experts run side by side (one whole problem per thread) and, with that
// switched off, in chunks with every thread on each problem (as they do on 1 thread): both are
// checked, and must give the same bits, or a model's results would depend on its thread count.
TEST(Gemm, GroupedAmxPathMatchesReferenceInAllForms) {
  const int64_t n = 64, k = 96;
  const std::vector<int64_t> ms = {0, 1, 31, 32, 33, 100, 7};
  for (GroupedForm f : {GroupedForm{Trans::N, Trans::T, 0.0f}, GroupedForm{Trans::N, Trans::N, 0.0f},
                        GroupedForm{Trans::T, Trans::N, 1.0f}}) {
    std::vector<std::vector<Tensor>> amx_outs;  // side by side, then chunked
    for (auto [amx, side_by_side] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      auto [problems, refs] = make_grouped_case(f, ms, n, k, DType::bf16, 700);
      gemm_use_amx(amx);
      gemm_grouped_side_by_side(side_by_side);
      gemm_cache_clear();
      gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
      const int64_t builds = gemm_cache_stats().misses;
      gemm_use_amx(true);
      gemm_grouped_side_by_side(true);
      if (amx && cpu::amx_usable()) {
        EXPECT_EQ(builds, 0) << "ta " << int(f.ta) << " tb " << int(f.tb);
      }
      for (size_t g = 0; g < ms.size(); ++g) {
        if (problems[g].C.numel() == 0) continue;
        // Exact bf16 inputs, f32 sums of <= 100 terms (plus C for the weight gradient): 1e-5 as above.
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5)
            << (amx ? "amx" : "onednn") << (side_by_side ? " side by side" : " chunked") << " ta " << int(f.ta)
            << " tb " << int(f.tb) << " m " << ms[g];
      }
      if (amx) {
        amx_outs.emplace_back();
        for (auto& p : problems) amx_outs.back().push_back(p.C);
      }
    }
    if (cpu::amx_usable()) {  // without AMX these two ran oneDNN primitives built for different thread counts
      for (size_t g = 0; g < ms.size(); ++g) {
        EXPECT_TRUE(same_bits(amx_outs[0][g], amx_outs[1][g]))
            << "ta " << int(f.ta) << " tb " << int(f.tb) << " m " << ms[g];
      }
    }
  }
}

// A grouped bf16 call that the AMX path would take still checks every problem: a wrong inner dim
// is an error naming both shapes, before anything runs.
TEST(Gemm, GroupedAmxPathRejectsMismatchedShapes) {
  std::vector<GemmProblem> ps = {
      {random_tensor({5, 64}, 1, 1.0f, DType::bf16), random_tensor({32, 64}, 2, 1.0f, DType::bf16),
       Tensor::empty({5, 32}, DType::f32)},
      {random_tensor({7, 96}, 3, 1.0f, DType::bf16), random_tensor({32, 64}, 4, 1.0f, DType::bf16),
       Tensor::empty({7, 32}, DType::f32)}};
  std::string msg = test::error_of([&] { gemm_grouped(ps, Trans::N, Trans::T); });
  EXPECT_NE(msg.find("[7, 96]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 64]"), std::string::npos) << msg;
}

TEST(Gemm, ZeroInnerDimScalesC) {
  Tensor A = Tensor::empty({4, 0}, DType::f32), B = Tensor::empty({0, 3}, DType::f32);
  Tensor C = random_tensor({4, 3}, 5);
  auto c0 = to_f64(C);
  gemm(A, Trans::N, B, Trans::N, C, 1.0f, 0.5f);
  for (int64_t i = 0; i < C.numel(); ++i) EXPECT_EQ(C.data<float>()[i], static_cast<float>(0.5 * c0[i]));
}

// C0 + op(A)·op(B) (beta 1) run once per entry of `threads`, on that many threads: the results in
// that order (the caller's thread count restored).
std::vector<Tensor> gemm_on_thread_counts(const Tensor& A, Trans ta, const Tensor& B, Trans tb,
                                          const Tensor& C0, std::initializer_list<int> threads) {
  const int saved = num_threads();
  std::vector<Tensor> outs;
  for (int t : threads) {
    set_num_threads(t);
    Tensor C = C0.clone();
    gemm(A, ta, B, tb, C, 1.0f, 1.0f);
    outs.push_back(C);
  }
  set_num_threads(saved);
  return outs;
}

TEST(Gemm, DeterministicAcrossRunsAndThreadCounts) {
  // Includes a long-K, small-MN shape, where a library is most tempted to split the reduction.
  for (Dims d : {Dims{64, 48, 33}, Dims{8, 8, 4096}, Dims{200, 300, 256}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor A = random_tensor({d.m, d.k}, 61, 1.0f, dt), B = random_tensor({d.n, d.k}, 62, 1.0f, dt);
      const std::vector<Tensor> outs =
          gemm_on_thread_counts(A, Trans::N, B, Trans::T, random_tensor({d.m, d.n}, 63), {1, 2, 2, 1});
      for (size_t i = 1; i < outs.size(); ++i)
        EXPECT_TRUE(same_bits(outs[0], outs[i])) << d.m << "x" << d.n << "x" << d.k << " " << dtype_name(dt);
    }
  }
}

// Weight gradients over many tokens (dW += dyᵀ·x, too small to cut into pieces: the demo router's
// 64×64 and 9×64 over 2,048 tokens, 256×64, and 64×128 over 8,192): with few output blocks to share
// out, oneDNN's brgemm splits the token dim among its threads, which made the 1- and 2-thread (and
// 4-thread) sums differ (tools/gemm_split_k_probe.cc; run_plain now keeps such products on one
// thread). Bitwise the same on 1 to 4 threads, f32 and bf16 (with the bf16 half of the rule left
// out, 256×64×2048 and 64×128×8192 in bf16 differed on 2–4 threads).
TEST(Gemm, SmallOutputProductsAreThreadCountFree) {
  for (Dims d :
       {Dims{64, 64, 2048}, Dims{9, 64, 2048}, Dims{256, 64, 2048}, Dims{64, 9, 4096}, Dims{64, 128, 8192}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor A = random_tensor({d.k, d.m}, 71, 1.0f, dt), B = random_tensor({d.k, d.n}, 72, 1.0f, dt);
      const std::vector<Tensor> outs =
          gemm_on_thread_counts(A, Trans::T, B, Trans::N, random_tensor({d.m, d.n}, 73), {1, 2, 3, 4});
      for (size_t i = 1; i < outs.size(); ++i)
        EXPECT_TRUE(same_bits(outs[0], outs[i]))
            << d.m << "x" << d.n << "x" << d.k << " " << dtype_name(dt) << ", " << i + 1 << " threads";
    }
  }
}

// C0 + 0.5·op(A)·op(B) (beta 1) on 1 and then 2 threads: each result within 1e-5 of the float64
// reference (f32 accumulation of a few hundred exact products: ~1e-6 in norm), and the two bitwise
// the same. Returns the 1-thread result. `what` names the case in failure messages.
Tensor check_on_1_and_2_threads(const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C0,
                                const std::vector<double>& ref, const std::string& what) {
  std::vector<Tensor> outs;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor C = C0.clone();
    gemm(A, ta, B, tb, C, 0.5f, 1.0f);
    EXPECT_LT(test::rel_error(C, ref), 1e-5) << what << ", " << threads << " thread(s)";
    outs.push_back(C);
  }
  EXPECT_TRUE(same_bits(outs[0], outs[1])) << what;
  return outs[0];
}

// The AVX2-only paths (gemm.cc: bf16 widened to f32; every GEMM as pieces fixed by its shape, each on
// a one-thread primitive), forced on whatever CPU runs the tests. Shapes cut into 1, 2 and 4 pieces,
// along M and along N (N > M), every transpose (the pieces are strided views of op(A), op(B), C),
// the padded copies of pieces' operands (Aᵀ·B: A's rows 2048 floats apart in 2048×64×128, B's 128
// or 256 apart when it is transposed; A·B: B's 256 apart in 300×256×64), among them the operand
// every piece reads, copied once per call (B when the cut is along M, as in 300×256×64; A along N,
// as in Aᵀ·B 128×520×100), and of a grouped dy·W's weight (rows 1024 floats apart), a grouped x·Wᵀ
// with a large weight (cut along W's rows), batched, and grouped in all three MoE forms: each right
// against float64 (1e-5: f32 accumulation of ≤ 512 exact products, as above; bf16 inputs are exact
// in double), and bitwise the same on 1 and 2 threads.
TEST(Gemm, Avx2PathsMatchReferenceAndAreThreadCountFree) {
  const int saved = num_threads();
  gemm_force_avx2_paths(true);
  for (Dims d : {Dims{64, 48, 33}, Dims{300, 72, 256}, Dims{40, 520, 300}, Dims{2048, 64, 128}, Dims{128, 520, 100},
                 Dims{300, 256, 64}}) {
    for (DType dt : {DType::f32, DType::bf16})
      for (Trans ta : {Trans::N, Trans::T})
        for (Trans tb : {Trans::N, Trans::T}) {
          Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 21, 1.0f, dt);
          Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 22, 1.0f, dt);
          Tensor C0 = random_tensor({d.m, d.n}, 23);
          auto ref = gemm_reference(to_f64(A), ta, to_f64(B), tb, to_f64(C0), 1, d.m, d.n, d.k, 0.5, 1.0);
          check_on_1_and_2_threads(A, ta, B, tb, C0, ref,
                                   str(d.m, "x", d.n, "x", d.k, " ", dtype_name(dt), " ta ", int(ta), " tb ", int(tb)));
        }
  }
  {  // batched, B shared and per entry
    Tensor A = random_tensor({3, 130, 40}, 31), B = random_tensor({40, 90}, 32), B3 = random_tensor({3, 40, 90}, 33);
    for (const Tensor* b : {&B, &B3}) {
      std::vector<Tensor> outs;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Tensor C = Tensor::zeros({3, 130, 90}, DType::f32);
        gemm(A, Trans::N, *b, Trans::N, C);
        auto ref = gemm_reference(to_f64(A), Trans::N, to_f64(*b), Trans::N, std::vector<double>(3 * 130 * 90, 0.0),
                                  3, 130, 90, 40, 1, 0, b == &B);
        EXPECT_LT(test::rel_error(C, ref), 1e-5);
        outs.push_back(C);
      }
      EXPECT_TRUE(same_bits(outs[0], outs[1])) << "batched";
    }
  }
  const std::vector<int64_t> ms = {300, 0, 45, 129, 7};
  for (DType dt : {DType::f32, DType::bf16})
    for (GroupedForm f : {GroupedForm{Trans::N, Trans::T, 0.0f}, GroupedForm{Trans::N, Trans::N, 1.0f},
                          GroupedForm{Trans::T, Trans::N, 1.0f}}) {
      std::vector<std::vector<Tensor>> outs;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        auto [problems, refs] = make_grouped_case(f, ms, 80, 64, dt, 700);
        gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
        outs.emplace_back();
        for (size_t g = 0; g < ms.size(); ++g) {
          EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5) << "group " << g << " ta " << int(f.ta);
          outs.back().push_back(problems[g].C);
        }
      }
      for (size_t g = 0; g < ms.size(); ++g)
        EXPECT_TRUE(same_bits(outs[0][g], outs[1][g])) << dtype_name(dt) << " group " << g << " ta " << int(f.ta);
    }
  {  // dy·W with the weight's rows 4 KiB apart (N = 1024): the weight copied once to a padded stride
    const std::vector<int64_t> ms2 = {300, 45, 7};
    const GroupedForm f{Trans::N, Trans::N, 1.0f};
    std::vector<std::vector<Tensor>> outs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      auto [problems, refs] = make_grouped_case(f, ms2, 24, 1024, DType::f32, 900);
      gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
      outs.emplace_back();
      for (size_t g = 0; g < ms2.size(); ++g) {
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5) << "padded weight, group " << g;
        outs.back().push_back(problems[g].C);
      }
    }
    for (size_t g = 0; g < ms2.size(); ++g) EXPECT_TRUE(same_bits(outs[0][g], outs[1][g])) << "padded weight " << g;
  }
  {  // x·Wᵀ with a large weight (N·K ≥ 2^20, N above the token count): pieces along W's rows
    const std::vector<int64_t> ms3 = {300, 45, 7};
    const GroupedForm f{Trans::N, Trans::T, 0.0f};
    std::vector<std::vector<Tensor>> outs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      auto [problems, refs] = make_grouped_case(f, ms3, 2048, 512, DType::f32, 950);
      gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
      outs.emplace_back();
      for (size_t g = 0; g < ms3.size(); ++g) {
        // f32 accumulation of 512 exact products: ~sqrt(512)·2^-24 ≈ 1.4e-6 in norm.
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5) << "large weight, group " << g;
        outs.back().push_back(problems[g].C);
      }
    }
    for (size_t g = 0; g < ms3.size(); ++g) EXPECT_TRUE(same_bits(outs[0][g], outs[1][g])) << "large weight " << g;
  }
  gemm_force_avx2_paths(false);
  set_num_threads(saved);
}

// Taken pieces (gemm.cc: large f32 products on the avx512_core paths cut by their shape and taken
// by the threads in turn): cut along M (1000 × 200) and along N (200 × 1000) into three pieces,
// the last one shorter, in every transpose. Each right against float64 (1e-5: f32 accumulation of
// 256 exact products, ~sqrt(256)·2^-24 ≈ 1e-6 in norm), bitwise the same on 1 and 2 threads, and
// within the same bound of the uncut path (a different blocking may round differently).
TEST(Gemm, TakenPiecesMatchReferenceAndAreThreadCountFree) {
  if (gemm_avx2_paths()) GTEST_SKIP() << "this CPU runs every GEMM as shape pieces (AVX2 paths)";
  const int saved = num_threads();
  for (Dims d : {Dims{1000, 200, 256}, Dims{200, 1000, 256}})
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T}) {
        Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 41);
        Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 42);
        Tensor C0 = random_tensor({d.m, d.n}, 43);
        auto ref = gemm_reference(to_f64(A), ta, to_f64(B), tb, to_f64(C0), 1, d.m, d.n, d.k, 0.5, 1.0);
        const GemmCacheStats before = gemm_cache_stats();
        const Tensor pieces =
            check_on_1_and_2_threads(A, ta, B, tb, C0, ref, str(d.m, "x", d.n, " ta ", int(ta), " tb ", int(tb)));
        // Three pieces of two sizes: two one-thread primitives, built on the first call, found after.
        EXPECT_EQ(gemm_cache_stats().misses - before.misses, 2);
        gemm_taken_pieces(false);
        Tensor whole = C0.clone();
        gemm(A, ta, B, tb, whole, 0.5f, 1.0f);
        gemm_taken_pieces(true);
        EXPECT_LT(test::rel_error(pieces, to_f64(whole)), 1e-5) << "pieces against the uncut path";
      }
  set_num_threads(saved);
}

TEST(Gemm, PrimitivesAreCached) {
  Tensor A = random_tensor({6, 10}, 71), B = random_tensor({10, 12}, 72),
         C = Tensor::empty({6, 12}, DType::f32);
  gemm(A, Trans::N, B, Trans::N, C);
  GemmCacheStats before = gemm_cache_stats();
  for (int i = 0; i < 3; ++i) gemm(A, Trans::N, B, Trans::N, C);
  GemmCacheStats after = gemm_cache_stats();
  EXPECT_EQ(after.hits - before.hits, 3);
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.size, before.size);
}

// The GEMM time counters (the benchmarks' "GEMM floor") count each call once and 2·M·N·K FLOPs per
// problem, batched and grouped alike; empty problems count nothing. Exact integers: no tolerance.
TEST(Gemm, TimeStatsCountCallsAndFlops) {
  Tensor A = random_tensor({2, 6, 10}, 81), B = random_tensor({10, 12}, 82),
         C = Tensor::empty({2, 6, 12}, DType::f32);
  Tensor W = random_tensor({8, 10}, 83);
  std::vector<GemmProblem> groups = {{random_tensor({5, 10}, 84), W, Tensor::empty({5, 8}, DType::f32)},
                                     {random_tensor({0, 10}, 85), W, Tensor::empty({0, 8}, DType::f32)},
                                     {random_tensor({3, 10}, 86), W, Tensor::empty({3, 8}, DType::f32)}};
  gemm_time_reset();
  gemm(A, Trans::N, B, Trans::N, C);
  gemm_grouped(groups, Trans::N, Trans::T);
  GemmTimeStats s = gemm_time_stats();
  EXPECT_EQ(s.calls, 2);
  EXPECT_EQ(s.flops, 2.0 * 2 * 6 * 12 * 10 + 2.0 * (5 + 3) * 8 * 10);
  EXPECT_GT(s.seconds, 0.0);
  gemm_time_reset();
  EXPECT_EQ(gemm_time_stats().calls, 0);
  EXPECT_EQ(gemm_time_stats().flops, 0.0);
}

// With shape profiling on, each call lands in its shape's row (a grouped call in one row whatever
// its token counts); the rows add up to the totals. Exact integers again.
TEST(Gemm, ShapeTimesAddUpToTheTotals) {
  Tensor A = random_tensor({2, 6, 10}, 91), B = random_tensor({10, 12}, 92),
         C = Tensor::empty({2, 6, 12}, DType::f32);
  Tensor W = random_tensor({8, 10}, 93);
  std::vector<GemmProblem> groups = {{random_tensor({5, 10}, 94), W, Tensor::empty({5, 8}, DType::f32)},
                                     {random_tensor({3, 10}, 95), W, Tensor::empty({3, 8}, DType::f32)}};
  gemm_time_reset();
  gemm_profile_shapes(true);
  gemm(A, Trans::N, B, Trans::N, C);
  gemm(A, Trans::N, B, Trans::N, C);
  gemm_grouped(groups, Trans::N, Trans::T);
  gemm_profile_shapes(false);
  gemm(A, Trans::N, B, Trans::N, C);  // not profiled: in the totals only
  std::vector<GemmShapeTime> rows = gemm_shape_times();
  ASSERT_EQ(rows.size(), 2u);
  std::map<std::string, GemmShapeTime> by;
  for (const auto& r : rows) by[r.shape] = r;
  ASSERT_TRUE(by.count("NN [2] 6x12x10 f32")) << rows[0].shape << ", " << rows[1].shape;
  ASSERT_TRUE(by.count("grouped NT ?x8x10 f32")) << rows[0].shape << ", " << rows[1].shape;
  EXPECT_EQ(by["NN [2] 6x12x10 f32"].calls, 2);
  EXPECT_EQ(by["NN [2] 6x12x10 f32"].flops, 2 * 2.0 * 2 * 6 * 12 * 10);
  EXPECT_EQ(by["grouped NT ?x8x10 f32"].calls, 1);
  EXPECT_EQ(by["grouped NT ?x8x10 f32"].flops, 2.0 * (5 + 3) * 8 * 10);
  EXPECT_EQ(gemm_time_stats().calls, 4);
  // A GEMM run outside gemm() (the loss's fused head) joins the totals, and its row when profiling.
  gemm_time_record("fused 1x2x3", 0.25, 12.0);
  gemm_profile_shapes(true);
  gemm_time_record("fused 1x2x3", 0.5, 12.0);
  gemm_profile_shapes(false);
  EXPECT_EQ(gemm_time_stats().calls, 6);
  EXPECT_EQ(gemm_time_stats().flops, 3 * 2.0 * 2 * 6 * 12 * 10 + 2.0 * (5 + 3) * 8 * 10 + 24.0);
  rows = gemm_shape_times();
  ASSERT_EQ(rows.size(), 3u);
  by.clear();
  for (const auto& r : rows) by[r.shape] = r;
  EXPECT_EQ(by["fused 1x2x3"].calls, 1);
  EXPECT_EQ(by["fused 1x2x3"].flops, 12.0);
  EXPECT_NEAR(by["fused 1x2x3"].seconds, 0.5, 1e-9);  // whole nanoseconds
  gemm_time_reset();
  EXPECT_TRUE(gemm_shape_times().empty());
}

using zaya::test::error_of;

TEST(Gemm, ShapeErrorsNameBothShapes) {
  Tensor A = random_tensor({5, 7}, 1), B = random_tensor({6, 4}, 2), C = Tensor::empty({5, 4}, DType::f32);
  std::string msg = error_of([&] { gemm(A, Trans::N, B, Trans::N, C); });
  EXPECT_NE(msg.find("[5, 7]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[6, 4]"), std::string::npos) << msg;
  Tensor B2 = random_tensor({7, 4}, 2), C2 = Tensor::empty({4, 5}, DType::f32);
  msg = error_of([&] { gemm(A, Trans::N, B2, Trans::N, C2); });
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5, 4]"), std::string::npos) << msg;
  Tensor Ab = random_tensor({5, 7}, 1, 1.0f, DType::bf16);
  EXPECT_THROW(gemm(Ab, Trans::N, B2, Trans::N, C), Error);  // mixed dtypes
  EXPECT_THROW(gemm(A, Trans::N, B2, Trans::N, A), Error);   // C is not [5, 4]
}

TEST(Gemm, CudaTensorsAreRejected) {
  float dummy[20];
  Tensor A = Tensor::borrow(dummy, {5, 4}, DType::f32, Device::cuda);  // never dereferenced
  Tensor B = random_tensor({4, 3}, 2), C = Tensor::empty({5, 3}, DType::f32);
  std::string msg = error_of([&] { gemm(A, Trans::N, B, Trans::N, C); });
  EXPECT_NE(msg.find("no CUDA kernel yet"), std::string::npos) << msg;
}

}  // namespace
}  // namespace zaya::ops
