#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/sizing/expert_sweep.h"
#include "zaya/sizing/model_gemms.h"
#include "zaya/sizing/suggest.h"

namespace zaya::sizing {
namespace {

model::ModelConfig medium_model() {
  model::ModelConfig c;
  c.hidden_size = 1024;
  c.num_attention_heads = 8;
  c.num_experts = 8;
  c.moe_intermediate_size = 1024;
  c.router_hidden_size = 128;
  return c;
}

HardwareProfile table_profile() {
  HardwareProfile p = builtin_profile("h100");
  p.gemm_table = {{64, 64, 64, 1e12}, {256, 1024, 1024, 1e14}, {4096, 4096, 4096, 7e14}};
  return p;
}

TEST(ExpertSweep, TopOneTrainingComputeIsSizeModelsForBothKindsOfProfile) {
  const model::ModelConfig c = medium_model();
  RunShape run;
  run.mbs = 2;
  run.seq = 1024;
  for (const HardwareProfile& hw : {builtin_profile("mi300x"), table_profile()}) {
    const double want = size_model(c, run, hw).compute_time_s;
    // Same FLOPs summed in another order (datasheet) or the same GEMM list (table).
    EXPECT_NEAR(training_compute_seconds(c, run, hw, 1), want, 1e-12 * want) << hw.name;
  }
}

TEST(ExpertSweep, FamiliesHoldWhatTheyClaimFixed) {
  const model::ModelConfig c = medium_model();
  RunShape run;
  run.mbs = 2;
  run.seq = 1024;
  const auto rows = sweep_experts(c, run, builtin_profile("h200"), ExpertSweepOptions{});
  ASSERT_EQ(rows.size(), 10u);  // 4 fine-grained, 4 count, 2 coarse
  const auto n0 = model::count_parameters(c);
  int originals = 0;
  for (const auto& r : rows) {
    originals += r.is_original;
    // Fixed exactly, apart from the router's out_proj [E + 1, R] per layer, which follows E.
    const int64_t router_delta = c.num_hidden_layers * (r.config.num_experts - c.num_experts) * c.router_hidden_size;
    if (r.family != "coarse") {
      EXPECT_EQ(r.active - router_delta, n0.active) << r.family << " E " << r.config.num_experts;
    }
    if (r.family != "count") {
      EXPECT_EQ(r.total - router_delta, n0.total) << r.family << " E " << r.config.num_experts;
    }
    const int64_t E = r.config.num_experts, I = r.config.moe_intermediate_size;
    if (r.family != "coarse") {
      EXPECT_EQ(r.top_k * I, c.moe_intermediate_size) << r.family;  // one token's width
    }
    if (r.family != "count") {
      EXPECT_EQ(E * I, c.num_experts * c.moe_intermediate_size) << r.family;  // all experts' width
    }
    ASSERT_EQ(r.decode.size(), 2u);
    EXPECT_EQ(r.decode[0].batch, 1);
    EXPECT_EQ(r.decode[1].batch, 64);
    // The serving weights are every parameter plus the balancing biases, at 2 bytes.
    EXPECT_DOUBLE_EQ(r.serve_weight_bytes,
                     2.0 * static_cast<double>(r.total + r.config.num_hidden_layers * r.config.router_classes()));
  }
  EXPECT_EQ(originals, 1);
  // Coarse experts: more active parameters, so a slower batch-1 decode than the original's.
  EXPECT_GT(rows[8].decode[0].step_s, rows[0].decode[0].step_s);
  const nlohmann::json j = nlohmann::json::parse(expert_sweep_json(rows, builtin_profile("h200"), ExpertSweepOptions{}));
  EXPECT_EQ(j["rows"].size(), 10u);
  EXPECT_EQ(j["rows"][0]["decode"][1]["batch"], 64);
  HardwareProfile no_bw = builtin_profile("h100");
  no_bw.memory_bandwidth = 0;
  EXPECT_THROW(sweep_experts(c, run, no_bw, ExpertSweepOptions{}), Error);
}

TEST(ExpertSweep, TopKTokensSpreadOverMoreExpertRows) {
  model::ModelConfig c = medium_model();
  c.num_experts = 16;
  c.moe_intermediate_size = 512;
  int64_t rows_k1 = 0, rows_k2 = 0;
  for (const auto& g : model_gemms(c, 4096, 1))
    if (g.name == "expert.gate_up" && g.pass == GemmPass::forward) rows_k1 = g.m;
  for (const auto& g : model_gemms(c, 4096, 2))
    if (g.name == "expert.gate_up" && g.pass == GemmPass::forward) rows_k2 = g.m;
  EXPECT_EQ(rows_k1, 256);
  EXPECT_EQ(rows_k2, 512);
}

TEST(Suggest, JointObjectiveRanksByTheWeightedRelativeTimes) {
  const model::ModelConfig c = medium_model();
  RunShape run;
  run.mbs = 4;
  run.seq = 2048;
  const HardwareProfile hw = builtin_profile("h200");
  SuggestOptions o;
  o.max_results = 6;
  o.decode_batch = 64;
  for (double w : {0.0, 0.5, 1.0}) {
    o.decode_weight = w;
    const auto s = suggest_shapes(c, run, hw, o);
    ASSERT_GE(s.size(), 3u);
    const Suggestion* orig = nullptr;
    for (const auto& x : s)
      if (x.is_original) orig = &x;
    ASSERT_NE(orig, nullptr);
    EXPECT_DOUBLE_EQ(orig->score, 1.0);
    for (size_t i = 0; i < s.size(); ++i) {
      const double want = (1 - w) * s[i].report.step_time_s / orig->report.step_time_s +
                          w * s[i].decode.step_s / orig->decode.step_s;
      EXPECT_NEAR(s[i].score, want, 1e-12) << "w " << w << " rank " << i;
      EXPECT_EQ(s[i].decode.batch, 64);
      if (i) {
        EXPECT_LE(s[i - 1].score, s[i].score) << "w " << w;
      }
    }
  }
  o.decode_weight = 1.5;
  EXPECT_THROW(suggest_shapes(c, run, hw, o), Error);
  o.decode_weight = 0.5;
  HardwareProfile no_bw = hw;
  no_bw.memory_bandwidth = 0;
  EXPECT_THROW(suggest_shapes(c, run, no_bw, o), Error);
}

}  // namespace
}  // namespace zaya::sizing
