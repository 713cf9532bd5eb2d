// The grouped GEMMs (ops::gemm_grouped: the MoE layer's per-expert products) against a float64
// reference: empty groups, token counts that change from call to call, consecutive rows that run
// past their problem's end, large weights, problems sharing an output. The CPU's own paths (AMX,
// side by side, thread counts) are in cpu/test_gemm_grouped_cpu.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "ops/gemm_reference.h"
#include "ops/gradcheck.h"
#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/amx_gemm.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops {
namespace {

using namespace gemm_test;

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
      Tensor Ae = A.slice(off, off + ms[e]), We = W.select(static_cast<int64_t>(e)),
             Ce = C.slice(off, off + ms[e]);
      refs.push_back(
          gemm_reference(to_f64(Ae), Trans::N, to_f64(We), Trans::T, to_f64(Ce), 1, ms[e], c.n, c.k, 1, 0));
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
      cpu::gemm_use_amx(amx);
      cpu::gemm_force_bf16_fixed_shapes(fixed);
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
  cpu::gemm_use_amx(true);
  cpu::gemm_force_bf16_fixed_shapes(false);
}

TEST(Gemm, GroupedProblemsSharingAnOutputAccumulateInOrder) {
  // Four weight-gradient problems adding into ONE C (beta = 1), as gradient accumulation over
  // micro-batches could: they must not run side by side (two threads adding into the same C lose
  // updates), and after `calls` calls C holds C0 + calls · Σ_g A_gᵀ·B_g. Small token counts and
  // a larger C make the additions into C a large part of each product, so a race would show: with
  // the overlap check in gemm_grouped_cpu.cc's split_problems removed, this failed in 1 to 2 of 5 runs.
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

}  // namespace
}  // namespace zaya::ops
