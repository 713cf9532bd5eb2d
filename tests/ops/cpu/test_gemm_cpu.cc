// The CPU GEMM's own paths and plans (ops/cpu/gemm_cpu.cc): results that do not depend on the
// thread count, the AVX2-only paths and taken pieces forced on any CPU, the primitive cache and the
// GEMM time counters. The device-neutral contract (float64 reference, errors) is in ../test_gemm.cc.
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

// C0 + op(A)·op(B) (beta 1) run once per entry of `threads`, on that many threads: the results in
// that order (the caller's thread count restored).
std::vector<Tensor> gemm_on_thread_counts(const Tensor& A, Trans ta, const Tensor& B, Trans tb,
                                          const Tensor& C0, std::initializer_list<int> threads) {
  const int saved = num_threads();
  std::vector<Tensor> outs;
  for (int t : threads) {
    set_num_threads(t);
    Tensor C = C0.clone();
    gemm(C, A, ta, B, tb, 1.0f, 1.0f);
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
    gemm(C, A, ta, B, tb, 0.5f, 1.0f);
    EXPECT_LT(test::rel_error(C, ref), 1e-5) << what << ", " << threads << " thread(s)";
    outs.push_back(C);
  }
  EXPECT_TRUE(same_bits(outs[0], outs[1])) << what;
  return outs[0];
}

// The AVX2-only paths (gemm_cpu.cc: bf16 widened to f32; every GEMM as pieces fixed by its shape, each on
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
  cpu::gemm_force_avx2_paths(true);
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
        gemm(C, A, Trans::N, *b, Trans::N);
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
  cpu::gemm_force_avx2_paths(false);
  set_num_threads(saved);
}

// Taken pieces (gemm_cpu.cc: large f32 products on the avx512_core paths cut by their shape and taken
// by the threads in turn): cut along M (1000 × 200) and along N (200 × 1000) into three pieces,
// the last one shorter, in every transpose. Each right against float64 (1e-5: f32 accumulation of
// 256 exact products, ~sqrt(256)·2^-24 ≈ 1e-6 in norm), bitwise the same on 1 and 2 threads, and
// within the same bound of the uncut path (a different blocking may round differently).
TEST(Gemm, TakenPiecesMatchReferenceAndAreThreadCountFree) {
  if (cpu::gemm_avx2_paths()) GTEST_SKIP() << "this CPU runs every GEMM as shape pieces (AVX2 paths)";
  const int saved = num_threads();
  for (Dims d : {Dims{1000, 200, 256}, Dims{200, 1000, 256}})
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T}) {
        Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 41);
        Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 42);
        Tensor C0 = random_tensor({d.m, d.n}, 43);
        auto ref = gemm_reference(to_f64(A), ta, to_f64(B), tb, to_f64(C0), 1, d.m, d.n, d.k, 0.5, 1.0);
        const cpu::GemmCacheStats before = cpu::gemm_cache_stats();
        const Tensor pieces =
            check_on_1_and_2_threads(A, ta, B, tb, C0, ref, str(d.m, "x", d.n, " ta ", int(ta), " tb ", int(tb)));
        // Three pieces of two sizes: two one-thread primitives, built on the first call, found after.
        EXPECT_EQ(cpu::gemm_cache_stats().misses - before.misses, 2);
        cpu::gemm_taken_pieces(false);
        Tensor whole = C0.clone();
        gemm(whole, A, ta, B, tb, 0.5f, 1.0f);
        cpu::gemm_taken_pieces(true);
        EXPECT_LT(test::rel_error(pieces, to_f64(whole)), 1e-5) << "pieces against the uncut path";
      }
  set_num_threads(saved);
}

TEST(Gemm, PrimitivesAreCached) {
  Tensor A = random_tensor({6, 10}, 71), B = random_tensor({10, 12}, 72),
         C = Tensor::empty({6, 12}, DType::f32);
  gemm(C, A, Trans::N, B, Trans::N);
  cpu::GemmCacheStats before = cpu::gemm_cache_stats();
  for (int i = 0; i < 3; ++i) gemm(C, A, Trans::N, B, Trans::N);
  cpu::GemmCacheStats after = cpu::gemm_cache_stats();
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
  cpu::gemm_time_reset();
  gemm(C, A, Trans::N, B, Trans::N);
  gemm_grouped(groups, Trans::N, Trans::T);
  cpu::GemmTimeStats s = cpu::gemm_time_stats();
  EXPECT_EQ(s.calls, 2);
  EXPECT_EQ(s.flops, 2.0 * 2 * 6 * 12 * 10 + 2.0 * (5 + 3) * 8 * 10);
  EXPECT_GT(s.seconds, 0.0);
  cpu::gemm_time_reset();
  EXPECT_EQ(cpu::gemm_time_stats().calls, 0);
  EXPECT_EQ(cpu::gemm_time_stats().flops, 0.0);
}

// With shape profiling on, each call lands in its shape's row (a grouped call in one row whatever
// its token counts); the rows add up to the totals. Exact integers again.
TEST(Gemm, ShapeTimesAddUpToTheTotals) {
  Tensor A = random_tensor({2, 6, 10}, 91), B = random_tensor({10, 12}, 92),
         C = Tensor::empty({2, 6, 12}, DType::f32);
  Tensor W = random_tensor({8, 10}, 93);
  std::vector<GemmProblem> groups = {{random_tensor({5, 10}, 94), W, Tensor::empty({5, 8}, DType::f32)},
                                     {random_tensor({3, 10}, 95), W, Tensor::empty({3, 8}, DType::f32)}};
  cpu::gemm_time_reset();
  cpu::gemm_profile_shapes(true);
  gemm(C, A, Trans::N, B, Trans::N);
  gemm(C, A, Trans::N, B, Trans::N);
  gemm_grouped(groups, Trans::N, Trans::T);
  cpu::gemm_profile_shapes(false);
  gemm(C, A, Trans::N, B, Trans::N);  // not profiled: in the totals only
  std::vector<cpu::GemmShapeTime> rows = cpu::gemm_shape_times();
  ASSERT_EQ(rows.size(), 2u);
  std::map<std::string, cpu::GemmShapeTime> by;
  for (const auto& r : rows) by[r.shape] = r;
  ASSERT_TRUE(by.count("NN [2] 6x12x10 f32")) << rows[0].shape << ", " << rows[1].shape;
  ASSERT_TRUE(by.count("grouped NT ?x8x10 f32")) << rows[0].shape << ", " << rows[1].shape;
  EXPECT_EQ(by["NN [2] 6x12x10 f32"].calls, 2);
  EXPECT_EQ(by["NN [2] 6x12x10 f32"].flops, 2 * 2.0 * 2 * 6 * 12 * 10);
  EXPECT_EQ(by["grouped NT ?x8x10 f32"].calls, 1);
  EXPECT_EQ(by["grouped NT ?x8x10 f32"].flops, 2.0 * (5 + 3) * 8 * 10);
  EXPECT_EQ(cpu::gemm_time_stats().calls, 4);
  // A GEMM run outside gemm() (the loss's fused head) joins the totals, and its row when profiling.
  cpu::gemm_time_record("fused 1x2x3", 0.25, 12.0);
  cpu::gemm_profile_shapes(true);
  cpu::gemm_time_record("fused 1x2x3", 0.5, 12.0);
  cpu::gemm_profile_shapes(false);
  EXPECT_EQ(cpu::gemm_time_stats().calls, 6);
  EXPECT_EQ(cpu::gemm_time_stats().flops, 3 * 2.0 * 2 * 6 * 12 * 10 + 2.0 * (5 + 3) * 8 * 10 + 24.0);
  rows = cpu::gemm_shape_times();
  ASSERT_EQ(rows.size(), 3u);
  by.clear();
  for (const auto& r : rows) by[r.shape] = r;
  EXPECT_EQ(by["fused 1x2x3"].calls, 1);
  EXPECT_EQ(by["fused 1x2x3"].flops, 12.0);
  EXPECT_NEAR(by["fused 1x2x3"].seconds, 0.5, 1e-9);  // whole nanoseconds
  cpu::gemm_time_reset();
  EXPECT_TRUE(cpu::gemm_shape_times().empty());
}

}  // namespace
}  // namespace zaya::ops
