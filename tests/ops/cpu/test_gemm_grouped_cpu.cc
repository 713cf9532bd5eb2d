// The CPU grouped GEMMs' own paths and plans (ops/cpu/gemm_grouped_cpu.cc): token counts that do
// not build a primitive each, results that do not depend on the thread count, experts side by side
// (one whole GEMM per thread) and zaya's AMX kernel. The device-neutral contract is in
// ../test_gemm_grouped.cc.
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

// A new token count must not build a new primitive (0.4–2 ms each): with a small weight, f32
// groups share one runtime-M primitive per form, bf16 groups one per whole-32-row body plus one
// for the padded tail. 40 calls with fresh counts in [1, 200]: f32 builds nothing after the first call,
// bf16 at most 200/32 + 1 = 7 primitives in all.
TEST(Gemm, GroupedTokenCountsDoNotBuildAPrimitiveEach) {
  const int64_t n = 16, k = 24;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor W = random_tensor({n, k}, 7, 1.0f, dt);
    int64_t first_misses = 0;
    cpu::GemmCacheStats start = cpu::gemm_cache_stats();
    for (int call = 0; call < 40; ++call) {
      int64_t m = 1 + (call * 37 + 11) % 200;
      std::vector<GemmProblem> p = {
          {random_tensor({m, k}, 8 + call, 1.0f, dt), W, Tensor::empty({m, n}, DType::f32)}};
      gemm_grouped(p, Trans::N, Trans::T);
      if (call == 0) first_misses = cpu::gemm_cache_stats().misses - start.misses;
    }
    int64_t misses = cpu::gemm_cache_stats().misses - start.misses;
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
          cpu::gemm_force_bf16_fixed_shapes(fixed);
          gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
          cpu::gemm_force_bf16_fixed_shapes(false);
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
      cpu::gemm_use_amx(amx);
      cpu::gemm_grouped_side_by_side(side_by_side);
      cpu::gemm_cache_clear();
      gemm_grouped(problems, f.ta, f.tb, 1.0f, f.beta);
      const int64_t builds = cpu::gemm_cache_stats().misses;
      cpu::gemm_use_amx(true);
      cpu::gemm_grouped_side_by_side(true);
      if (amx && cpu::amx_usable()) {
        EXPECT_EQ(builds, 0) << "ta " << int(f.ta) << " tb " << int(f.tb);
      }
      for (size_t g = 0; g < ms.size(); ++g) {
        if (problems[g].C.numel() == 0) continue;
        // Exact bf16 inputs, f32 sums of <= 100 terms (plus C for the weight gradient): 1e-5 as above.
        EXPECT_LT(test::rel_error(problems[g].C, refs[g]), 1e-5)
            << (amx ? "amx" : "onednn") << (side_by_side ? " side by side" : " chunked") << " ta "
            << int(f.ta) << " tb " << int(f.tb) << " m " << ms[g];
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

}  // namespace
}  // namespace zaya::ops
