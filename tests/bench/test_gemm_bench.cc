#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <tuple>

#include "zaya/bench/gemm_bench.h"
#include "zaya/bench/sysinfo.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"

namespace zaya::bench {
namespace {

TEST(GemmBench, ModelShapesAreEveryGemmOfATrainingStep) {
  model::ModelConfig c;  // H 256, L 4, nq 4, nkv 2, hd 64, E 8, I 512, R 64, V 8192
  const int64_t T = 512;
  const auto cases = model_gemm_cases(c, T, 0);
  // 9 linear layers x 3 GEMMs (forward, backward data, backward weight).
  ASSERT_EQ(cases.size(), 27u);
  std::set<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>> got;
  for (const auto& g : cases) got.insert({g.label, g.m, g.n, g.k, g.count});
  const int64_t qkv = 4 * 64 + 2 * 2 * 64;  // q + k + two half-width v projections
  const std::set<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>> want = {
      {"qkv_proj fwd", T, qkv, 256, 4},          {"qkv_proj bwd_data", T, 256, qkv, 4},
      {"qkv_proj bwd_weight", qkv, 256, T, 4},   {"o_proj fwd", T, 256, 256, 4},
      {"o_proj bwd_data", T, 256, 256, 4},       {"o_proj bwd_weight", 256, 256, T, 4},
      {"router.down_proj fwd", T, 64, 256, 4},   {"router.down_proj bwd_data", T, 256, 64, 4},
      {"router.down_proj bwd_weight", 64, 256, T, 4},
      {"router.fc1 fwd", T, 64, 64, 4},          {"router.fc1 bwd_data", T, 64, 64, 4},
      {"router.fc1 bwd_weight", 64, 64, T, 4},   {"router.fc2 fwd", T, 64, 64, 4},
      {"router.fc2 bwd_data", T, 64, 64, 4},     {"router.fc2 bwd_weight", 64, 64, T, 4},
      {"router.out_proj fwd", T, 9, 64, 4},      {"router.out_proj bwd_data", T, 64, 9, 4},
      {"router.out_proj bwd_weight", 9, 64, T, 4},
      {"expert.gate_up fwd", 64, 1024, 256, 32}, {"expert.gate_up bwd_data", 64, 256, 1024, 32},
      {"expert.gate_up bwd_weight", 1024, 256, 64, 32},
      {"expert.down fwd", 64, 256, 512, 32},     {"expert.down bwd_data", 64, 512, 256, 32},
      {"expert.down bwd_weight", 256, 512, 64, 32},
      {"lm_head fwd", T, 8192, 256, 1},          {"lm_head bwd_data", T, 256, 8192, 1},
      {"lm_head bwd_weight", 8192, 256, T, 1},
  };
  EXPECT_EQ(got, want);
  EXPECT_EQ(model_gemm_cases(c, T, 128).back().label, "square reference");
}

TEST(GemmBench, SweepCoversPowersOfTwoNonPowersAndAspectRatios) {
  const auto cases = sweep_gemm_cases(64, 1024);
  std::set<int64_t> squares;
  int rectangular = 0;
  for (const auto& c : cases) {
    if (c.square()) squares.insert(c.m);
    else ++rectangular;
  }
  EXPECT_EQ(squares, (std::set<int64_t>{64, 96, 128, 192, 256, 512, 768, 1000, 1024}));
  EXPECT_EQ(rectangular, 3 * 3 * 3 - 3);  // powers of four 64, 256, 1024 cubed, minus the squares
  EXPECT_THROW(sweep_gemm_cases(128, 64), Error);
}

TEST(GemmBench, ProfileFromResultsTakesTheBestSquareAsAchievable) {
  std::vector<GemmResult> rows = {{{"square", 64, 64, 64, 1}, 1, 1e9},
                                  {{"square", 512, 512, 512, 1}, 1, 4e9},
                                  {{"sweep", 64, 512, 512, 1}, 1, 5e9}};
  auto p = profile_from_gemm(rows, DType::f32, {}, 0);
  EXPECT_EQ(p.achievable_flops, 4e9);
  EXPECT_EQ(p.peak_bf16_flops, 5e9);  // no peak given: the best measured rate
  EXPECT_EQ(p.gemm_table.size(), 3u);
  EXPECT_EQ(p.gemm_dtype, "f32");
  EXPECT_EQ(profile_from_gemm(rows, DType::bf16, {}, 9e9).peak_bf16_flops, 9e9);
}

TEST(GemmBench, CudaBackendWithoutADeviceIsAClearError) {
  GemmBenchOptions o;
  o.cases = sweep_gemm_cases(8, 8);
  o.backend = "cuda";
  std::ostringstream out;
#ifndef ZAYA_HAVE_CUDA
  try {
    run_gemm_bench(o, out);
    FAIL() << "cuda backend ran in a CPU build";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
#endif
  o.backend = "tpu";
  EXPECT_THROW(o.validate(), Error);
}

// A profile's memory_bytes is what a model must fit in: the host's RAM for cpu, the GPU's memory
// for cuda (a measured cuBLASLt profile once carried 0, and `zaya size --hw` then warned that
// ZAYA1-base overflowed a 0 GiB device).
TEST(GemmBench, ProfileMemoryIsTheBackendsOwn) {
  EXPECT_NEAR(backend_memory_bytes("cpu"), query_sysinfo().memory_gib * 1073741824.0, 1.0);
  EXPECT_GT(backend_memory_bytes("cpu"), 0.0);
  if (cuda::device_count() == 0) {
    EXPECT_THROW(backend_memory_bytes("cuda"), Error);
    GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  }
  EXPECT_EQ(backend_memory_bytes("cuda"), static_cast<double>(cuda::devices().at(0).total_memory));
  EXPECT_GT(backend_memory_bytes("cuda"), 1e9);
}

}  // namespace
}  // namespace zaya::bench
