#include "zaya/model/config.h"

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/model/legacy_config.h"

namespace zaya::model {
namespace {

void need(bool ok, const std::string& source, const std::string& key, const std::string& expected,
          const std::string& found) {
  if (!ok) throw Error("invalid model config", {.file = source, .field = key, .expected = expected, .found = found});
}

std::string s(int64_t v) { return std::to_string(v); }

}  // namespace

void ModelConfig::validate(const std::string& src) const {
  need(vocab_size > 0, src, "vocab_size", "> 0", s(vocab_size));
  need(hidden_size > 0, src, "hidden_size", "> 0", s(hidden_size));
  need(num_hidden_layers > 0, src, "num_hidden_layers", "> 0", s(num_hidden_layers));
  need(num_attention_heads > 0, src, "num_attention_heads", "> 0", s(num_attention_heads));
  need(num_key_value_heads > 0, src, "num_key_value_heads", "> 0", s(num_key_value_heads));
  need(num_attention_heads % num_key_value_heads == 0, src, "num_attention_heads",
       "a multiple of num_key_value_heads (" + s(num_key_value_heads) + ")", s(num_attention_heads));
  need(head_dim > 0 && head_dim % 2 == 0, src, "head_dim", "a positive even number", s(head_dim));
  need(kv_dim() % 2 == 0, src, "num_key_value_heads * head_dim", "even (the value path splits it in halves)",
       s(kv_dim()));
  int64_t rot = rotary_dim();
  need(partial_rotary_factor > 0 && partial_rotary_factor <= 1 && rot % 2 == 0 && rot > 0, src,
       "partial_rotary_factor", "in (0, 1] giving an even number of rotary dims",
       std::to_string(partial_rotary_factor) + " (" + s(rot) + " dims)");
  need(num_experts >= 1, src, "num_experts", ">= 1", s(num_experts));
  need(moe_intermediate_size > 0, src, "moe_intermediate_size", "> 0", s(moe_intermediate_size));
  need(router_hidden_size > 0, src, "router_hidden_size", "> 0", s(router_hidden_size));
  need(rms_norm_eps > 0, src, "rms_norm_eps", "> 0", std::to_string(rms_norm_eps));
  need(rope_theta > 0, src, "rope_theta", "> 0", std::to_string(rope_theta));
  need(max_position_embeddings > 0, src, "max_position_embeddings", "> 0", s(max_position_embeddings));
  need(initializer_range > 0, src, "initializer_range", "> 0", std::to_string(initializer_range));
  need(pad_token_id >= 0 && pad_token_id < vocab_size, src, "pad_token_id", "in [0, vocab_size)", s(pad_token_id));
  need(eos_token_id >= 0 && eos_token_id < vocab_size, src, "eos_token_id", "in [0, vocab_size)", s(eos_token_id));
  need(bos_token_id >= 0 && bos_token_id < vocab_size, src, "bos_token_id", "in [0, vocab_size)", s(bos_token_id));
}

ModelConfig ModelConfig::from_toml(ConfigReader& r) {
  ModelConfig c;
  r.get("model.vocab_size", c.vocab_size);
  r.get("model.hidden_size", c.hidden_size);
  r.get("model.num_hidden_layers", c.num_hidden_layers);
  r.get("model.num_attention_heads", c.num_attention_heads);
  r.get("model.num_key_value_heads", c.num_key_value_heads);
  r.get("model.head_dim", c.head_dim);
  r.get("model.num_experts", c.num_experts);
  r.get("model.moe_intermediate_size", c.moe_intermediate_size);
  r.get("model.router_hidden_size", c.router_hidden_size);
  r.get("model.rms_norm_eps", c.rms_norm_eps);
  r.get("model.rope_theta", c.rope_theta);
  r.get("model.partial_rotary_factor", c.partial_rotary_factor);
  r.get("model.max_position_embeddings", c.max_position_embeddings);
  r.get("model.initializer_range", c.initializer_range);
  r.get("model.key_temperature_init", c.key_temperature_init);
  r.get("model.pad_token_id", c.pad_token_id);
  r.get("model.bos_token_id", c.bos_token_id);
  r.get("model.eos_token_id", c.eos_token_id);
  r.get("model.skip_passthrough", c.skip_passthrough);
  int64_t experts_per_tok = 1;
  r.get("model.num_experts_per_tok", experts_per_tok);
  need(experts_per_tok == 1, r.file(), "model.num_experts_per_tok", "1 (ZAYA1 routes each token to one expert)",
       s(experts_per_tok));
  c.validate(r.file());
  return c;
}

ModelConfig ModelConfig::from_hf_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open model config", {.file = path});
  std::ostringstream text;
  text << in.rdbuf();
  return from_hf_json_text(text.str(), path);
}

ModelConfig ModelConfig::from_hf_json_text(const std::string& text, const std::string& src) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error or a number out of range
    throw Error(std::string("invalid JSON: ") + e.what(), {.file = src});
  }
  need(j.is_object(), src, "(top level)", "a JSON object", j.type_name());
  const bool has_type = j.contains("model_type");
  need(has_type && j["model_type"] == "zaya", src, "model_type", "\"zaya\"",
       has_type ? j["model_type"].dump() : "\"\"");
  // The released ZAYA1-base's config.json is in the legacy layout of Zyphra's transformers fork.
  if (is_legacy_hf_config(j)) return legacy_hf_config(j, src);

  auto get_int = [&](const char* key, int64_t& out, bool required) {
    if (!j.contains(key) || j[key].is_null()) {
      need(!required, src, key, "an integer", "nothing");
      return;
    }
    const auto& v = j[key];
    // An unsigned beyond int64 would wrap to a negative number and be reported as one.
    const bool fits = !v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX};
    need(v.is_number_integer() && fits, src, key, "an integer", v.dump());
    out = v.get<int64_t>();
  };
  auto get_num = [&](const nlohmann::json& obj, const char* key, double& out) {
    if (!obj.contains(key) || obj[key].is_null()) return;
    need(obj[key].is_number(), src, key, "a number", obj[key].dump());
    out = obj[key].get<double>();
  };

  ModelConfig c;
  get_int("vocab_size", c.vocab_size, true);
  get_int("hidden_size", c.hidden_size, true);
  get_int("num_hidden_layers", c.num_hidden_layers, true);
  get_int("num_attention_heads", c.num_attention_heads, true);
  get_int("num_key_value_heads", c.num_key_value_heads, true);
  get_int("head_dim", c.head_dim, true);
  get_int("num_experts", c.num_experts, true);
  get_int("moe_intermediate_size", c.moe_intermediate_size, true);
  get_int("router_hidden_size", c.router_hidden_size, true);
  get_int("max_position_embeddings", c.max_position_embeddings, false);
  get_int("pad_token_id", c.pad_token_id, false);
  get_int("bos_token_id", c.bos_token_id, false);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty()) {
    const auto& first = j["eos_token_id"][0];
    const bool fits = !first.is_number_unsigned() || first.get<uint64_t>() <= uint64_t{INT64_MAX};
    need(first.is_number_integer() && fits, src, "eos_token_id", "an integer or a list of integers",
         j["eos_token_id"].dump());
    c.eos_token_id = first.get<int64_t>();
  } else
    get_int("eos_token_id", c.eos_token_id, false);
  get_num(j, "rms_norm_eps", c.rms_norm_eps);
  get_num(j, "initializer_range", c.initializer_range);
  // zaya's own key (transformers' ZayaConfig keeps it as an unused attribute): a model imported
  // from the legacy layout keeps the legacy skip behaviour through zaya's checkpoints and exports.
  if (j.contains("skip_passthrough") && !j["skip_passthrough"].is_null()) {
    need(j["skip_passthrough"].is_boolean(), src, "skip_passthrough", "true or false", j["skip_passthrough"].dump());
    c.skip_passthrough = j["skip_passthrough"].get<bool>();
  }
  int64_t k = 1;
  get_int("num_experts_per_tok", k, false);
  need(k == 1, src, "num_experts_per_tok", "1", s(k));
  int64_t t0 = 2, t1 = 2;
  get_int("cca_time0", t0, false);
  get_int("cca_time1", t1, false);
  need(t0 == 2 && t1 == 2, src, "cca_time0/cca_time1", "2 and 2 (the CCA kernels zaya implements)",
       s(t0) + " and " + s(t1));
  if (j.contains("tie_word_embeddings"))
    need(j["tie_word_embeddings"] == true, src, "tie_word_embeddings", "true", j["tie_word_embeddings"].dump());
  if (j.contains("attention_bias"))
    need(j["attention_bias"] == false, src, "attention_bias", "false", j["attention_bias"].dump());
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      need(t == "hybrid", src, "layer_types", "\"hybrid\" for every layer (no sliding window)", t.dump());
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const auto& rp = j["rope_parameters"];
    const auto& h = rp.contains("hybrid") ? rp["hybrid"] : rp;
    get_num(h, "rope_theta", c.rope_theta);
    get_num(h, "partial_rotary_factor", c.partial_rotary_factor);
  } else {
    get_num(j, "rope_theta", c.rope_theta);
    get_num(j, "partial_rotary_factor", c.partial_rotary_factor);
  }
  c.validate(src);
  return c;
}

std::string ModelConfig::to_hf_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = {"ZayaForCausalLM"};
  j["model_type"] = "zaya";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_experts"] = num_experts;
  j["num_experts_per_tok"] = 1;
  j["router_hidden_size"] = router_hidden_size;
  j["cca_time0"] = 2;
  j["cca_time1"] = 2;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["tie_word_embeddings"] = true;
  j["layer_types"] = std::vector<std::string>(static_cast<size_t>(num_hidden_layers), "hybrid");
  j["rope_parameters"] = {
      {"hybrid", {{"rope_type", "default"}, {"rope_theta", rope_theta}, {"partial_rotary_factor", partial_rotary_factor}}},
      {"hybrid_sliding", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", partial_rotary_factor}}}};
  j["pad_token_id"] = pad_token_id;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["use_cache"] = true;
  // Only when on: a native model's config.json stays exactly transformers' keys.
  if (skip_passthrough) j["skip_passthrough"] = true;
  return j.dump(2) + "\n";
}

std::string ModelConfig::differences(const ModelConfig& other) const {
  const nlohmann::json a = nlohmann::json::parse(to_hf_json()), b = nlohmann::json::parse(other.to_hf_json());
  std::string out;
  for (const auto& [key, value] : a.items())
    if (!b.contains(key) || b[key] != value)
      out += (out.empty() ? "" : "; ") + key + ": " + value.dump() + " vs " + (b.contains(key) ? b[key].dump() : "none");
  return out;
}

}  // namespace zaya::model
