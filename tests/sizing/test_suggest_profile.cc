#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/sizing/hardware.h"
#include "zaya/sizing/model_gemms.h"
#include "zaya/sizing/suggest.h"

namespace zaya::sizing {
namespace {

model::ModelConfig small_model() {
  model::ModelConfig c;  // defaults: H 256, L 4, 4/2 heads x 64, 8 experts x 512, R 64, V 8192
  c.hidden_size = 1024;
  c.num_attention_heads = 8;
  c.num_experts = 8;
  c.moe_intermediate_size = 1024;
  c.router_hidden_size = 128;
  return c;
}

TEST(Profile, JsonRoundTripKeepsEveryFieldAndTheGemmTable) {
  HardwareProfile p = builtin_profile("h100");
  p.gemm_dtype = "bf16";
  p.gemm_table = {{64, 64, 64, 1.5e12}, {4096, 4096, 4096, 7.5e14}, {4096, 512, 2048, 3.25e14}};
  const std::string path = ::testing::TempDir() + "/zaya_profile_rt.json";
  save_profile(p, path);
  const HardwareProfile q = load_profile(path);
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.source, p.source);
  EXPECT_EQ(q.peak_bf16_flops, p.peak_bf16_flops);  // JSON doubles round-trip exactly
  EXPECT_EQ(q.achievable_flops, p.achievable_flops);
  EXPECT_EQ(q.memory_bytes, p.memory_bytes);
  EXPECT_EQ(q.memory_bandwidth, p.memory_bandwidth);
  EXPECT_EQ(q.intra_node_bandwidth, p.intra_node_bandwidth);
  EXPECT_EQ(q.inter_node_bandwidth, p.inter_node_bandwidth);
  EXPECT_EQ(q.gpus_per_node, p.gpus_per_node);
  EXPECT_EQ(q.gemm_dtype, "bf16");
  ASSERT_EQ(q.gemm_table.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q.gemm_table[i].m, p.gemm_table[i].m);
    EXPECT_EQ(q.gemm_table[i].n, p.gemm_table[i].n);
    EXPECT_EQ(q.gemm_table[i].k, p.gemm_table[i].k);
    EXPECT_EQ(q.gemm_table[i].flops_per_s, p.gemm_table[i].flops_per_s);
  }
  std::ofstream(path) << R"({"peak_bf16_flops": 1, "memory_bytes": 1, "memory_bandwidth": 1, "gemm_table": [{"m": 1, "n": 2}]})";
  try {
    load_profile(path);
    FAIL() << "a GEMM entry without k was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().field, "gemm_table[0].k");
  }
}

TEST(Profile, GemmRateInterpolatesInLogSizeAndClampsAtTheEnds) {
  HardwareProfile p = builtin_profile("h100");
  EXPECT_EQ(gemm_rate(p, 8, 8, 8), p.achievable_flops);  // no table: one rate
  p.gemm_table = {{64, 64, 64, 1e12}, {1024, 1024, 1024, 5e14}};
  EXPECT_EQ(gemm_rate(p, 8, 8, 8), 1e12);
  EXPECT_EQ(gemm_rate(p, 8192, 8192, 8192), 5e14);
  // 256^3 is halfway between 64^3 and 1024^3 in log(size): the mean of the two rates.
  EXPECT_NEAR(gemm_rate(p, 256, 256, 256), 0.5 * (1e12 + 5e14), 1e-9 * 5e14);  // rounding of log()
}

TEST(ModelGemms, FlopsMatchSixTimesTheActiveMatrixParameters) {
  const model::ModelConfig c = small_model();
  const int64_t T = 4096;
  double gemm = 0;
  for (const auto& g : model_gemms(c, T)) gemm += g.flops();
  // 6 · T · (active matrix parameters + the tied LM head) exactly: T is a multiple of E, so each
  // expert's T/E rows times L·E experts is T rows per layer.
  double matrices = 0;
  for (const auto& p : model::parameter_specs(c)) {
    if (p.role == model::ParamRole::matrix || p.role == model::ParamRole::embedding)
      matrices += static_cast<double>(p.shape.numel());
    if (p.role == model::ParamRole::expert_matrix) matrices += static_cast<double>(p.shape.numel()) / c.num_experts;
  }
  EXPECT_DOUBLE_EQ(gemm, 6.0 * T * matrices);
}

TEST(Suggest, ReturnsSortedShapesWithinTheBudgetThatPassTheRules) {
  const model::ModelConfig c = small_model();
  RunShape run;
  run.mbs = 4;
  run.seq = 2048;
  for (Budget b : {Budget::total, Budget::active}) {
    SuggestOptions o;
    o.budget = b;
    o.max_results = 8;
    const auto s = suggest_shapes(c, run, builtin_profile("h100"), o);
    ASSERT_GE(s.size(), 3u);
    int originals = 0;
    const auto n0 = model::count_parameters(c);
    const double target = static_cast<double>(b == Budget::total ? n0.total : n0.active);
    for (size_t i = 0; i < s.size(); ++i) {
      originals += s[i].is_original;
      if (i) {
        EXPECT_LE(s[i - 1].report.step_time_s, s[i].report.step_time_s);
      }
      const auto n = model::count_parameters(s[i].config);
      EXPECT_LE(std::abs(static_cast<double>(b == Budget::total ? n.total : n.active) / target - 1), 0.05);
      if (!s[i].is_original) {
        for (const auto& r : s[i].report.rules) {
          if (r.hard) {
            EXPECT_TRUE(r.ok) << r.rule;
          }
        }
      }
    }
    EXPECT_EQ(originals, 1);
  }
  EXPECT_THROW(parse_budget("params", "--budget"), Error);
}

}  // namespace
}  // namespace zaya::sizing
