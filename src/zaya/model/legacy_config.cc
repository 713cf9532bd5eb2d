#include "zaya/model/legacy_config.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

#include "zaya/core/error.h"

namespace zaya::model {
namespace {

using nlohmann::json;

void need(bool ok, const std::string& source, const std::string& key, const std::string& expected,
          const std::string& found) {
  if (!ok)
    throw Error("legacy ZAYA1 config.json: not representable in the native model",
                {.file = source, .field = key, .expected = expected, .found = found});
}

std::string s(int64_t v) { return std::to_string(v); }

bool is_int(const json& v) {
  return v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
}

// Reads the config's keys with errors that name the file and the key.
class Reader {
 public:
  Reader(const json& j, const std::string& src) : j_(j), src_(src) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& at(const char* key) const { return j_[key]; }

  std::optional<int64_t> opt_int(const char* key) const {
    if (!has(key)) return std::nullopt;
    need(is_int(j_[key]), src_, key, "an integer", j_[key].dump());
    return j_[key].get<int64_t>();
  }
  int64_t req_int(const char* key) const {
    auto v = opt_int(key);
    need(v.has_value(), src_, key, "an integer", "nothing");
    return *v;
  }
  void num(const char* key, double& out) const {
    if (!has(key)) return;
    need(j_[key].is_number(), src_, key, "a number", j_[key].dump());
    out = j_[key].get<double>();
  }
  // A key the native model has one fixed answer for: absent, or equal to `want`.
  void fixed(const char* key, const json& want, const std::string& why) const {
    if (!j_.contains(key)) return;
    need(j_[key] == want, src_, key, want.dump() + " (" + why + ")", j_[key].dump());
  }

  // A per-half-layer value of the half-layers of one kind (attention: even indices, MoE: odd):
  // a scalar, or a list of `halves` entries holding the value on that kind and 0 on the other.
  // Every half-layer of the kind must have the same positive value: the native model has one
  // shape for all its layers.
  std::optional<int64_t> per_half_layer(const char* key, int64_t halves, bool attention) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_[key];
    if (is_int(v)) {
      need(v.get<int64_t>() > 0, src_, key, "> 0", v.dump());
      return v.get<int64_t>();
    }
    need(v.is_array(), src_, key, "an integer or a list with one entry per half-layer", v.dump());
    need(static_cast<int64_t>(v.size()) == halves, src_, key,
         s(halves) + " entries (one per half-layer, as zaya_layers)", s(static_cast<int64_t>(v.size())));
    std::optional<int64_t> value;
    for (int64_t i = 0; i < halves; ++i) {
      const json& e = v[static_cast<size_t>(i)];
      const std::string field = std::string(key) + "[" + s(i) + "]";
      need(is_int(e), src_, field, "an integer", e.dump());
      const int64_t x = e.get<int64_t>();
      const bool ours = (i % 2 == 0) == attention;
      if (!ours) {
        need(x == 0, src_, field,
             std::string("0 (half-layer ") + s(i) + " is " + (attention ? "a MoE" : "an attention") + " half-layer)",
             s(x));
        continue;
      }
      if (!value) {
        need(x > 0, src_, field, "> 0", s(x));
        value = x;
      }
      need(x == *value, src_, field,
           s(*value) + " (the value of the first " + (attention ? "attention" : "MoE") +
               " half-layer: the native model has one shape for every layer)",
           s(x));
    }
    return value;
  }

 private:
  const json& j_;
  const std::string& src_;
};

constexpr const char* kLegacyOnlyKeys[] = {"zaya_layers",        "cca",           "cca_num_q_heads",
                                           "num_query_groups",   "num_query_groups_list",
                                           "ffn_hidden_size",    "ffn_hidden_size_list",
                                           "zaya_mlp_expansion", "kv_channels",   "norm_epsilon",
                                           "moe_router_topk"};
constexpr const char* kNativeOnlyKeys[] = {"moe_intermediate_size", "router_hidden_size", "layer_types"};

}  // namespace

bool is_legacy_hf_config(const json& j) {
  if (!j.is_object()) return false;
  for (const char* k : kNativeOnlyKeys)
    if (j.contains(k)) return false;
  for (const char* k : kLegacyOnlyKeys)
    if (j.contains(k)) return true;
  return false;
}

ModelConfig legacy_hf_config(const json& j, const std::string& src) {
  need(j.is_object(), src, "(top level)", "a JSON object", j.type_name());
  const Reader r(j, src);
  ModelConfig c;

  // The half-layer schedule: zaya_layers ("a" = attention, an integer = a MoE half-layer with that
  // many experts) when present, else num_hidden_layers half-layers alternating from attention. The
  // fork's ZayaConfig lets zaya_layers override a disagreeing num_hidden_layers, so do we.
  int64_t halves = 0;
  std::optional<int64_t> experts;
  if (r.has("zaya_layers")) {
    const json& zl = r.at("zaya_layers");
    need(zl.is_array() && !zl.empty(), src, "zaya_layers", "a non-empty list of \"a\" and expert counts", zl.dump());
    halves = static_cast<int64_t>(zl.size());
    for (int64_t i = 0; i < halves; ++i) {
      const json& e = zl[static_cast<size_t>(i)];
      const std::string field = "zaya_layers[" + s(i) + "]";
      if (i % 2 == 0) {
        need(e == "a", src, field, "\"a\" (even half-layers are attention in the layout zaya converts)", e.dump());
      } else {
        need(is_int(e) && e.get<int64_t>() > 0, src, field, "an expert count (odd half-layers are MoE)", e.dump());
        if (!experts) experts = e.get<int64_t>();
        need(e.get<int64_t>() == *experts, src, field, s(*experts) + " (every MoE half-layer has the same experts)",
             e.dump());
      }
    }
  } else {
    halves = r.req_int("num_hidden_layers");
  }
  need(halves >= 2 && halves % 2 == 0, src, r.has("zaya_layers") ? "zaya_layers" : "num_hidden_layers",
       "an even number of half-layers >= 2 (attention, MoE pairs)", s(halves));
  c.num_hidden_layers = halves / 2;

  if (auto e = r.opt_int("num_experts")) {
    if (experts)
      need(*e == *experts, src, "num_experts", s(*experts) + " (the expert count in zaya_layers)", s(*e));
    experts = e;
  }
  need(experts.has_value(), src, "num_experts", "an integer (or expert counts in zaya_layers)", "nothing");
  c.num_experts = *experts;

  c.vocab_size = r.req_int("vocab_size");
  c.hidden_size = r.req_int("hidden_size");

  auto nq = r.per_half_layer("cca_num_q_heads", halves, /*attention=*/true);
  need(nq.has_value(), src, "cca_num_q_heads", "the query heads of each attention half-layer", "nothing");
  c.num_attention_heads = *nq;

  auto nkv = r.per_half_layer("num_query_groups_list", halves, true);
  if (auto g = r.per_half_layer("num_query_groups", halves, true)) {
    if (nkv) need(*g == *nkv, src, "num_query_groups", s(*nkv) + " (as num_query_groups_list)", s(*g));
    nkv = g;
  }
  if (auto kvh = r.opt_int("num_key_value_heads")) {
    if (nkv) need(*kvh == *nkv, src, "num_key_value_heads", s(*nkv) + " (as num_query_groups)", s(*kvh));
    nkv = kvh;
  }
  need(nkv.has_value(), src, "num_query_groups", "the key/value heads of each attention half-layer", "nothing");
  c.num_key_value_heads = *nkv;

  // The head width: kv_channels (Megatron's name) or head_dim; the fork's fallback is hidden_size
  // divided by num_attention_heads.
  std::optional<int64_t> hd = r.opt_int("kv_channels");
  if (auto h = r.opt_int("head_dim")) {
    if (hd) need(*h == *hd, src, "head_dim", s(*hd) + " (as kv_channels)", s(*h));
    hd = h;
  }
  if (!hd) {
    const int64_t heads = r.req_int("num_attention_heads");
    need(heads > 0 && c.hidden_size % heads == 0, src, "num_attention_heads",
         "a divisor of hidden_size (no kv_channels or head_dim: the head width is hidden_size / num_attention_heads)",
         s(heads));
    hd = c.hidden_size / heads;
  }
  c.head_dim = *hd;

  auto ffn = r.per_half_layer("ffn_hidden_size_list", halves, /*attention=*/false);
  if (auto f = r.per_half_layer("ffn_hidden_size", halves, false)) {
    if (ffn) need(*f == *ffn, src, "ffn_hidden_size", s(*ffn) + " (as ffn_hidden_size_list)", s(*f));
    ffn = f;
  }
  need(ffn.has_value(), src, "ffn_hidden_size", "the experts' fc1 width (gate and up) of each MoE half-layer",
       "nothing");
  need(*ffn % 2 == 0, src, "ffn_hidden_size", "even (linear_fc1 holds the gate rows, then the up rows)", s(*ffn));
  c.moe_intermediate_size = *ffn / 2;

  auto router = r.per_half_layer("zaya_mlp_expansion", halves, /*attention=*/false);
  need(router.has_value(), src, "zaya_mlp_expansion", "the router width of each MoE half-layer", "nothing");
  c.router_hidden_size = *router;

  if (r.has("norm_epsilon"))
    r.num("norm_epsilon", c.rms_norm_eps);
  else
    r.num("rms_norm_eps", c.rms_norm_eps);
  r.num("rope_theta", c.rope_theta);
  r.num("partial_rotary_factor", c.partial_rotary_factor);
  r.num("initializer_range", c.initializer_range);
  if (auto v = r.opt_int("max_position_embeddings")) c.max_position_embeddings = *v;
  if (auto v = r.opt_int("pad_token_id")) c.pad_token_id = *v;
  if (auto v = r.opt_int("bos_token_id")) c.bos_token_id = *v;
  if (r.has("eos_token_id") && r.at("eos_token_id").is_array() && !r.at("eos_token_id").empty()) {
    const json& first = r.at("eos_token_id")[0];
    need(is_int(first), src, "eos_token_id", "an integer or a list of integers", r.at("eos_token_id").dump());
    c.eos_token_id = first.get<int64_t>();
  } else if (auto v = r.opt_int("eos_token_id")) {
    c.eos_token_id = *v;
  }

  // What the native model fixes. Each refusal names the key; docs/legacy-import.md says why.
  if (auto k = r.opt_int("moe_router_topk"))
    need(*k == 1, src, "moe_router_topk", "1 (ZAYA1 routes each token to one expert)", s(*k));
  if (auto k = r.opt_int("num_experts_per_tok"))
    need(*k == 1, src, "num_experts_per_tok", "1 (ZAYA1 routes each token to one expert)", s(*k));
  if (r.has("sliding_window"))
    need(false, src, "sliding_window", "null (zaya has no sliding-window attention)", r.at("sliding_window").dump());
  if (r.has("swa_layers")) {
    const json& w = r.at("swa_layers");
    need(w.is_array(), src, "swa_layers", "a list of per-half-layer windows", w.dump());
    for (size_t i = 0; i < w.size(); ++i)
      need(w[i] == 0, src, "swa_layers[" + s(static_cast<int64_t>(i)) + "]",
           "0 (zaya has no sliding-window attention)", w[i].dump());
  }
  if (r.has("rope_scaling")) {
    const json& rs = r.at("rope_scaling");
    bool plain = rs == false;
    if (rs.is_object()) {
      const json type = rs.contains("rope_type") ? rs["rope_type"] : rs.contains("type") ? rs["type"] : json("default");
      plain = type == "default";
    }
    need(plain, src, "rope_scaling", "null, false or {\"rope_type\": \"default\"} (plain RoPE)", rs.dump());
  }
  r.fixed("cca", true, "zaya's attention is CCA");
  r.fixed("cca_time0", 2, "the CCA kernels zaya implements");
  r.fixed("cca_time1", 2, "the CCA kernels zaya implements");
  r.fixed("clamp_temp", false, "zaya uses the key temperature linearly");
  r.fixed("zaya_use_mod", true, "the native router always has the skip class");
  // The fork's skip class (zaya_use_mod, whose default there is true) passes a token through as
  // p_skip times its normalized input: the legacy MoE's behaviour, kept (docs/legacy-import.md).
  c.skip_passthrough = true;
  r.fixed("zaya_use_eda", true, "the native router always mixes in the previous router state");
  r.fixed("scale_residual_merge", true, "the native layer always has residual scaling");
  r.fixed("gated_linear_unit", true, "experts are SwiGLU");
  r.fixed("activation_func", "swiglu", "experts are SwiGLU");
  r.fixed("normalization", "RMSNorm", "every norm is RMSNorm");
  r.fixed("add_bias_linear", false, "experts have no biases");
  r.fixed("attention_bias", false, "attention projections have no biases");
  r.fixed("lm_head_bias", false, "the LM head is the tied embedding, without bias");
  r.fixed("tie_word_embeddings", true, "the LM head is the tied embedding");

  c.validate(src);
  return c;
}

}  // namespace zaya::model
