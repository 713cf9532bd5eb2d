// The profile's experts_table (the measured experts op, `zaya bench gemm --experts-tokens`): its
// JSON, its errors, and how the decode roofline prices the experts with it.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "zaya/core/error.h"
#include "zaya/sizing/decode_roofline.h"
#include "zaya/sizing/hardware.h"

namespace zaya::sizing {
namespace {

// benchmarks/decode_calibration.toml's model: H 1024, L 8, 8/2 heads × 128, E 8 × I 1024, R 128.
model::ModelConfig calibration_model() {
  model::ModelConfig c;
  c.vocab_size = 32768, c.hidden_size = 1024, c.num_hidden_layers = 8, c.num_attention_heads = 8;
  c.num_key_value_heads = 2, c.head_dim = 128, c.num_experts = 8, c.moe_intermediate_size = 1024;
  c.router_hidden_size = 128, c.max_position_embeddings = 4096;
  c.validate("test config");
  return c;
}

// A CPU-like profile without a GEMM table: every GEMM at achievable_flops, so the expert GEMMs'
// share of the roofline can be computed by hand.
HardwareProfile cpu_like() {
  HardwareProfile p;
  p.name = "cpu-like";
  p.peak_bf16_flops = p.achievable_flops = 100e9;
  p.memory_bytes = 16e9;
  p.memory_bandwidth = 12.5e9;
  return p;
}

ExpertsPoint point(int64_t tokens, int64_t hit, double seconds, const std::string& dtype = "f32") {
  return {tokens, 8, hit, 1024, 1024, dtype, seconds};
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ExpertsTable, RoundTripsThroughTheProfileJson) {
  HardwareProfile p = cpu_like();
  p.experts_table = {point(1, 1, 4.125e-3), point(8, 8, 0.0215), {32, 16, 16, 2048, 2048, "bf16", 1.5e-4}};
  const std::string path = ::testing::TempDir() + "/zaya_experts_rt.json";
  save_profile(p, path);
  const HardwareProfile q = load_profile(path);
  ASSERT_EQ(q.experts_table.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const ExpertsPoint &a = p.experts_table[i], &b = q.experts_table[i];
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.experts, a.experts);
    EXPECT_EQ(b.experts_hit, a.experts_hit);
    EXPECT_EQ(b.hidden, a.hidden);
    EXPECT_EQ(b.intermediate, a.intermediate);
    EXPECT_EQ(b.weight_dtype, a.weight_dtype);
    EXPECT_EQ(b.seconds, a.seconds);  // JSON doubles round-trip exactly
  }
  // A profile without the table writes none and reads back none.
  save_profile(cpu_like(), path);
  EXPECT_TRUE(load_profile(path).experts_table.empty());
  EXPECT_EQ(profile_to_json(cpu_like()).find("experts_table"), std::string::npos);
}

TEST(ExpertsTable, BadEntriesNameTheField) {
  const std::string head =
      R"({"peak_bf16_flops": 1, "memory_bytes": 1, "memory_bandwidth": 1, "experts_table": )";
  const std::string good =
      R"({"tokens": 8, "experts": 8, "experts_hit": 8, "hidden": 64, "intermediate": 32, )"
      R"("weight_dtype": "f32", "seconds": 0.001})";
  auto field_of = [&](const std::string& table) -> std::string {
    try {
      load_profile(write("zaya_experts_bad.json", head + table + "}"));
    } catch (const Error& e) {
      return e.context().field;
    }
    return "(accepted)";
  };
  EXPECT_EQ(field_of("[" + good + "]"), "(accepted)");
  EXPECT_EQ(field_of(R"({"tokens": 1})"), "experts_table");
  EXPECT_EQ(field_of("[" + good + ", 3]"), "experts_table[1]");
  EXPECT_EQ(
      field_of(
          R"([{"experts": 8, "experts_hit": 1, "hidden": 64, "intermediate": 32, "weight_dtype": "f32", "seconds": 1}])"),
      "experts_table[0].tokens");
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 0, "experts": 8, "experts_hit": 1, "hidden": 64, "intermediate": 32, "weight_dtype": "f32", "seconds": 1}])"),
      "experts_table[0].tokens");
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 4, "experts": 8, "experts_hit": 5, "hidden": 64, "intermediate": 32, "weight_dtype": "f32", "seconds": 1}])"),
      "experts_table[0].experts_hit");  // more experts hit than tokens
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 16, "experts": 8, "experts_hit": 9, "hidden": 64, "intermediate": 32, "weight_dtype": "f32", "seconds": 1}])"),
      "experts_table[0].experts_hit");  // more than the layer has
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 4, "experts": 8, "experts_hit": 4, "hidden": 64.5, "intermediate": 32, "weight_dtype": "f32", "seconds": 1}])"),
      "experts_table[0].hidden");
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 4, "experts": 8, "experts_hit": 4, "hidden": 64, "intermediate": 32, "weight_dtype": "f16", "seconds": 1}])"),
      "experts_table[0].weight_dtype");
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 4, "experts": 8, "experts_hit": 4, "hidden": 64, "intermediate": 32, "weight_dtype": "f32", "seconds": 0}])"),
      "experts_table[0].seconds");
  EXPECT_EQ(
      field_of(
          R"([{"tokens": 4, "experts": 8, "experts_hit": 4, "hidden": 64, "intermediate": 32, "weight_dtype": "f32"}])"),
      "experts_table[0].seconds");
}

// The lookup: seconds per hit expert per token count, log-interpolated between counts, held below,
// scaled by rows per expert above; times the distinct experts asked for.
TEST(ExpertsTable, LookupInterpolatesInLogTokensAndScalesByDistinctExperts) {
  HardwareProfile p = cpu_like();
  // tokens 1: 4 ms per expert; tokens 4: 4 experts hit in 24 ms, 6 ms each; two runs at 4 averaged.
  p.experts_table = {point(1, 1, 4e-3), point(4, 4, 20e-3), point(4, 4, 28e-3), point(4, 4, 1.0, "bf16")};
  auto at = [&](double tokens, double distinct) {
    return measured_experts_seconds(p, 8, 1024, 1024, 4, tokens, distinct);
  };
  EXPECT_DOUBLE_EQ(at(1, 1), 4e-3);
  EXPECT_DOUBLE_EQ(at(4, 4), 24e-3);  // the bf16 entry is another dtype: not averaged in
  EXPECT_DOUBLE_EQ(at(4, 3.5), 3.5 * 6e-3);
  EXPECT_DOUBLE_EQ(at(2, 1.875), 1.875 * 5e-3);  // halfway in log(tokens) between 1 and 4
  EXPECT_DOUBLE_EQ(at(0.5, 0.5), 0.5 * 4e-3);    // held below the smallest count
  // Above the largest: 16 tokens over 8 experts is 2 rows each against the entry's 1: twice the time.
  EXPECT_DOUBLE_EQ(at(16, 8), 8 * 6e-3 * 2);
  EXPECT_DOUBLE_EQ(at(5, 5), 5 * 6e-3);  // 1 row each, as measured: held
  // Another shape or dtype has no entry.
  EXPECT_LT(measured_experts_seconds(p, 16, 1024, 1024, 4, 1, 1), 0);
  EXPECT_LT(measured_experts_seconds(p, 8, 2048, 1024, 4, 1, 1), 0);
  EXPECT_DOUBLE_EQ(measured_experts_seconds(p, 8, 1024, 1024, 2, 8, 8), 8 * 1.0 / 4);  // bf16: its own entry
}

TEST(ExpertsTable, DecodePricesTheExpertsByTheMeasuredOpWhenTheProfileHasIt) {
  const model::ModelConfig c = calibration_model();
  ServeOptions o;
  o.weight_bytes = o.cache_bytes = 4;
  const HardwareProfile plain = cpu_like();
  HardwareProfile slow = plain;
  // The experts op at 8 tokens: 8 experts hit, 100 ms per call (12.5 ms per expert, 1 GB/s of its
  // 12.6 MB of f32 weights): far slower than the roofline's.
  slow.experts_table = {point(8, 8, 0.1)};
  const int64_t B = 8, ctx = 32, L = 8, H = 1024, I = 1024;
  const DecodeStep r = decode_step(c, B, ctx, &plain, o), m = decode_step(c, B, ctx, &slow, o);
  EXPECT_FALSE(r.experts_measured);
  EXPECT_EQ(r.experts_s, 0.0);
  EXPECT_EQ(r.step_s, std::max(r.memory_s, r.compute_s));
  ASSERT_TRUE(m.experts_measured);
  // By hand: distinct experts 8·(1 − (7/8)^8); experts op L · distinct · 0.1 s / 8 hit.
  const double distinct = 8.0 * (1.0 - std::pow(7.0 / 8.0, 8));
  EXPECT_NEAR(m.experts_s, L * distinct * 0.1 / 8, 1e-15);
  // The rest of the roofline: the experts' bytes and FLOPs out. Top-1 expert GEMMs are B tokens ×
  // (gate_up 2I·H + down H·I) per layer, 2 FLOPs each, at achievable_flops (no GEMM table).
  const double expert_bytes = distinct * 3.0 * H * I * 4 * L;
  EXPECT_NEAR(m.memory_s, (r.bytes() - expert_bytes) / plain.memory_bandwidth, 1e-12 * r.memory_s);
  EXPECT_NEAR(r.memory_s - m.memory_s, expert_bytes / plain.memory_bandwidth, 1e-12 * r.memory_s);
  const double expert_gemm_s = 2.0 * B * 3.0 * H * I * L / plain.achievable_flops;
  EXPECT_NEAR(r.compute_s - m.compute_s, expert_gemm_s, 1e-12 * r.compute_s);
  EXPECT_NEAR(m.step_s, std::max(m.memory_s, m.compute_s) + m.experts_s, 1e-15);
  EXPECT_GT(m.step_s, r.step_s);  // the slow op makes the slower prediction
  EXPECT_STREQ(m.bound(), "experts");
  // Bytes and FLOPs counted are the same either way: only the time changes.
  EXPECT_EQ(m.bytes(), r.bytes());
  EXPECT_EQ(m.flops, r.flops);
}

TEST(ExpertsTable, WithoutAFittingEntryDecodeIsTheRooflineExactly) {
  const model::ModelConfig c = calibration_model();
  ServeOptions o;
  o.weight_bytes = o.cache_bytes = 4;
  const HardwareProfile plain = cpu_like();
  HardwareProfile other = plain;
  other.experts_table = {{8, 16, 8, 2048, 2048, "f32", 0.1}, point(8, 8, 0.1, "bf16")};  // other shape, dtype
  HardwareProfile fits = plain;
  fits.experts_table = {point(8, 8, 0.1)};
  ServeOptions top2 = o, compared = o;
  top2.top_k = 2;
  compared.measured_experts = false;
  for (int64_t b : {1, 8, 32}) {
    const DecodeStep r = decode_step(c, b, 32, &plain, o);
    for (const DecodeStep& s : {decode_step(c, b, 32, &other, o), decode_step(c, b, 32, &fits, compared)}) {
      EXPECT_FALSE(s.experts_measured);
      EXPECT_EQ(s.step_s, r.step_s);  // bitwise: the roofline path is unchanged
      EXPECT_EQ(s.memory_s, r.memory_s);
      EXPECT_EQ(s.compute_s, r.compute_s);
    }
    EXPECT_FALSE(decode_step(c, b, 32, &fits, top2).experts_measured);  // measured at top-1 only
  }
  const std::string none = format_serve_report(serve_model(c, 16, 32, {1, 8}, &plain, o));
  EXPECT_NE(none.find("experts: roofline (the profile has no experts_table"), std::string::npos) << none;
  EXPECT_EQ(none.find("experts (ms)"), std::string::npos) << none;
  const std::string miss = format_serve_report(serve_model(c, 16, 32, {1, 8}, &other, o));
  EXPECT_NE(miss.find("has no entry for 8 experts of H 1024, I 1024 at 4-byte weights"), std::string::npos)
      << miss;
  const std::string hit = format_serve_report(serve_model(c, 16, 32, {1, 8}, &fits, o));
  EXPECT_NE(hit.find("experts (ms)"), std::string::npos) << hit;
  EXPECT_NE(hit.find("experts: measured: ops::experts_forward of 8 experts of H 1024, I 1024"),
            std::string::npos)
      << hit;
}

}  // namespace
}  // namespace zaya::sizing
