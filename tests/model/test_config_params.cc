#include <gtest/gtest.h>

#include "test_util.h"

#include <nlohmann/json.hpp>
#include <set>

#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/model/config.h"
#include "zaya/model/params.h"

namespace zaya::model {
namespace {

ModelConfig zaya1_base() {
  ConfigReader r = ConfigReader::from_file(std::string(ZAYA_SOURCE_DIR) + "/configs/zaya1-base.toml");
  ModelConfig c = ModelConfig::from_toml(r);
  r.finish();
  return c;
}

TEST(ModelParams, Zaya1BaseCountsMatchThePublishedShapes) {
  ParamCounts n = count_parameters(zaya1_base());
  // DESIGN.md: 8.303B non-embedding, 0.754B active, 0.537B embedding; the issue allows ±0.1%.
  EXPECT_NEAR(static_cast<double>(n.non_embedding), 8.303e9, 8.303e6);
  EXPECT_NEAR(static_cast<double>(n.active), 0.754e9, 0.754e6);
  EXPECT_NEAR(static_cast<double>(n.embedding), 0.537e9, 0.537e6);
  EXPECT_EQ(kv_cache_bytes_per_token(zaya1_base(), 2), 40960);
}

TEST(ModelParams, NamesAreUniqueAndFollowHuggingFace) {
  ModelConfig c;
  c.num_hidden_layers = 3;
  auto specs = parameter_specs(c);
  std::set<std::string> names;
  for (const auto& p : specs) EXPECT_TRUE(names.insert(p.name).second) << p.name;
  EXPECT_TRUE(names.count("model.layers.0.self_attn.qkv_proj.conv_qk_grouped.weight"));
  EXPECT_TRUE(names.count("model.layers.2.mlp.experts.gate_up_proj"));
  // EDA scale only from layer 1 on.
  EXPECT_FALSE(names.count("model.layers.0.mlp.gate.router_states_scale"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.gate.router_states_scale"));
  EXPECT_FALSE(names.count("lm_head.weight"));  // tied
  for (const auto& p : specs) {
    if (p.name == "model.layers.1.self_attn.qkv_proj.conv_qk_grouped.weight") {
      EXPECT_EQ(p.shape, (Shape{c.conv_channels(), c.head_dim, 2}));
    }
  }
}

TEST(ModelConfig, HfJsonRoundTrip) {
  ModelConfig c = zaya1_base();
  ModelConfig back = ModelConfig::from_hf_json_text(c.to_hf_json(), "roundtrip");
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.num_experts, c.num_experts);
  EXPECT_EQ(back.rope_theta, c.rope_theta);
  EXPECT_EQ(back.partial_rotary_factor, c.partial_rotary_factor);
  EXPECT_EQ(back.eos_token_id, c.eos_token_id);
}

// skip_passthrough (the legacy MoE's skip class): off by default and then absent from config.json
// (a native model's config.json is exactly transformers' keys); on, written and read back, from
// TOML and config.json alike, and named by differences(); a non-boolean is an error naming it.
TEST(ModelConfig, SkipPassthroughRoundTripsAndIsNamed) {
  ModelConfig off = zaya1_base();
  EXPECT_FALSE(off.skip_passthrough);
  EXPECT_EQ(off.to_hf_json().find("skip_passthrough"), std::string::npos);
  ModelConfig on = off;
  on.skip_passthrough = true;
  EXPECT_TRUE(ModelConfig::from_hf_json_text(on.to_hf_json(), "roundtrip").skip_passthrough);
  EXPECT_FALSE(ModelConfig::from_hf_json_text(off.to_hf_json(), "roundtrip").skip_passthrough);
  EXPECT_NE(on.differences(off).find("skip_passthrough: true vs none"), std::string::npos) << on.differences(off);
  ConfigReader r = ConfigReader::from_string("[model]\nskip_passthrough = true\n", "m.toml");
  EXPECT_TRUE(ModelConfig::from_toml(r).skip_passthrough);
  nlohmann::json j = nlohmann::json::parse(off.to_hf_json());
  j["skip_passthrough"] = "yes";
  const std::string e = zaya::test::error_of([&] { ModelConfig::from_hf_json_text(j.dump(), "config.json"); });
  EXPECT_NE(e.find("skip_passthrough"), std::string::npos) << e;
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
}

// What train.init_from's mismatch error lists: every differing config.json key, with both values.
TEST(ModelConfig, DifferencesNameEveryDifferingKey) {
  ModelConfig a = zaya1_base(), b = zaya1_base();
  EXPECT_EQ(a.differences(b), "");
  b.rope_theta = 10000;
  b.max_position_embeddings = 4096;
  const std::string d = a.differences(b);
  EXPECT_NE(d.find("max_position_embeddings: 131072 vs 4096"), std::string::npos) << d;
  EXPECT_NE(d.find("rope_parameters"), std::string::npos) << d;
  EXPECT_EQ(d.find("hidden_size"), std::string::npos) << d;
}

using zaya::test::error_of;

TEST(ModelConfig, ValidationNamesTheKey) {
  auto toml_error = [](const std::string& text) {
    return error_of([&] {
      ConfigReader r = ConfigReader::from_string(text, "m.toml");
      ModelConfig::from_toml(r);
    });
  };
  std::string e = toml_error("[model]\nnum_attention_heads = 6\nnum_key_value_heads = 4\n");
  EXPECT_NE(e.find("m.toml: num_attention_heads"), std::string::npos) << e;
  EXPECT_NE(e.find("multiple of num_key_value_heads"), std::string::npos) << e;
  e = toml_error("[model]\nnum_experts_per_tok = 2\n");
  EXPECT_NE(e.find("num_experts_per_tok"), std::string::npos) << e;
  e = toml_error("[model]\nhead_dim = 15\n");
  EXPECT_NE(e.find("head_dim"), std::string::npos) << e;
  e = error_of([] { ModelConfig::from_hf_json_text(R"({"model_type": "llama"})", "config.json"); });
  EXPECT_NE(e.find("model_type"), std::string::npos) << e;
  e = error_of([] { ModelConfig::from_hf_json_text(R"({"model_type": "zaya", "hidden_size": "big"})", "config.json"); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  e = error_of([] { ModelConfig::from_hf_json_text("{not json", "config.json"); });
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;
}

// Inputs whose JSON values nlohmann rejects or converts with its own exceptions must still end in
// a zaya::Error naming the key (error_of lets any other exception through, failing the test). The
// first was found by tests/fuzz/fuzz_hf_config.
TEST(ModelConfig, HfJsonOddValuesAreErrorsNamingTheKey) {
  const auto hf_error = [](const std::string& json) {
    return error_of([&] { ModelConfig::from_hf_json_text(json, "config.json"); });
  };
  // A number beyond double's range: nlohmann's out_of_range, not a parse_error.
  std::string e = hf_error(R"({"model_type": "zaya", "rms_norm_eps": 1e99999})");
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
  e = hf_error(R"({"model_type": 5})");
  EXPECT_NE(e.find("model_type"), std::string::npos) << e;
  e = hf_error(R"({"vocab_size": 8192})");
  EXPECT_NE(e.find("model_type"), std::string::npos) << e;
  nlohmann::json full = nlohmann::json::parse(ModelConfig().to_hf_json());
  full["eos_token_id"] = {"</s>"};
  e = hf_error(full.dump());
  EXPECT_NE(e.find("eos_token_id"), std::string::npos) << e;
  // Beyond int64: reported as written, not wrapped to a negative number.
  e = hf_error(R"({"model_type": "zaya", "vocab_size": 18446744073709551615})");
  EXPECT_NE(e.find("vocab_size"), std::string::npos) << e;
  EXPECT_NE(e.find("18446744073709551615"), std::string::npos) << e;
  // A list of eos ids still reads its first.
  full["eos_token_id"] = {3, 4};
  EXPECT_EQ(ModelConfig::from_hf_json_text(full.dump(), "config.json").eos_token_id, 3);
}

}  // namespace
}  // namespace zaya::model
