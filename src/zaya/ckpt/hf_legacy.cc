#include "zaya/ckpt/hf_legacy.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "zaya/ckpt/hf_io.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"
#include "zaya/core/log.h"
#include "zaya/model/legacy_config.h"
#include "zaya/model/params.h"

namespace zaya::ckpt {

namespace fs = std::filesystem;

bool is_legacy_hf_dir(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  // A malformed file is not legacy here; the config reader reports what is wrong with it.
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  return !j.is_discarded() && model::is_legacy_hf_config(j);
}

namespace {

// Native names within a layer (after "model.layers.{i}.") -> legacy names within its attention
// half-layer (2i) or its MoE half-layer (2i+1).
struct Rename {
  const char* native;
  const char* legacy;
  bool moe_half;
};
constexpr Rename kLayerRenames[] = {
    {"input_layernorm.weight", "input_norm.weight", false},
    {"self_attn.qkv_proj.q_proj.weight", "self_attn.qkv.linear_q.weight", false},
    {"self_attn.qkv_proj.k_proj.weight", "self_attn.qkv.linear_k.weight", false},
    {"self_attn.qkv_proj.v_proj_current.weight", "self_attn.qkv.val_proj1.weight", false},
    {"self_attn.qkv_proj.v_proj_delayed.weight", "self_attn.qkv.val_proj2.weight", false},
    {"self_attn.qkv_proj.conv_qk_depthwise.weight", "self_attn.qkv.conv_qk.0.weight", false},
    {"self_attn.qkv_proj.conv_qk_depthwise.bias", "self_attn.qkv.conv_qk.0.bias", false},
    {"self_attn.qkv_proj.conv_qk_grouped.weight", "self_attn.qkv.conv_qk.1.weight", false},
    {"self_attn.qkv_proj.conv_qk_grouped.bias", "self_attn.qkv.conv_qk.1.bias", false},
    {"self_attn.qk_norm.temp", "self_attn.qkv.temp", false},
    {"self_attn.o_proj.weight", "self_attn.o_proj.weight", false},
    {"post_attention_layernorm.weight", "input_norm.weight", true},
    {"mlp.gate.down_proj.weight", "zaya_block.router.down_proj.weight", true},
    {"mlp.gate.down_proj.bias", "zaya_block.router.down_proj.bias", true},
    {"mlp.gate.router_states_scale", "zaya_block.router.router_states_scale", true},
    {"mlp.gate.router_mlp.norm.weight", "zaya_block.router.rmsnorm_eda.weight", true},
    {"mlp.gate.router_mlp.fc1.weight", "zaya_block.router.router_mlp.0.weight", true},
    {"mlp.gate.router_mlp.fc1.bias", "zaya_block.router.router_mlp.0.bias", true},
    {"mlp.gate.router_mlp.fc2.weight", "zaya_block.router.router_mlp.2.weight", true},
    {"mlp.gate.router_mlp.fc2.bias", "zaya_block.router.router_mlp.2.bias", true},
    {"mlp.gate.router_mlp.out_proj.weight", "zaya_block.router.router_mlp.4.weight", true},
    {"mlp.gate.balancing_biases", "zaya_block.router.balancing_biases", true},
};

std::string half(int64_t n) { return "model.layers." + std::to_string(n) + "."; }

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

std::vector<int64_t> skip_class_winning_layers(const model::ZayaModel& m) {
  const int64_t L = m.config().num_hidden_layers, E = m.config().num_experts;
  Tensor beta = m.balancing_biases();
  if (beta.device() != Device::cpu) beta = beta.to(Device::cpu);  // read on the host
  // argmax(p + beta) picks the skip class for some probability vector iff
  // beta_skip + 1 > max_e beta_e (p_skip = 1 is its best case).
  std::vector<int64_t> out;
  for (int64_t l = 0; l < L; ++l) {
    const float* b = beta.select(l).data<float>();
    if (static_cast<double>(b[E]) + 1.0 > static_cast<double>(*std::max_element(b, b + E))) out.push_back(l);
  }
  return out;
}

std::string layer_list(const std::vector<int64_t>& layers) {
  std::ostringstream s;
  for (size_t k = 0; k < layers.size(); ++k) s << (k ? ", " : "") << layers[k];
  return s.str();
}

std::string legacy_tensor_name(const std::string& native, int64_t layers, int64_t expert) {
  if (native == "model.embed_tokens.weight") return native;
  if (native == "model.norm.weight") return "model.final_norm.weight";
  // Half-layer 0's res_scale acts on the embeddings (there is no residual yet): the native input
  // scale and bias. It has no residual_scale/residual_bias.
  if (native == "model.input_hidden_states_scale") return "model.layers.0.res_scale.hidden_states_scale";
  if (native == "model.input_hidden_states_bias") return "model.layers.0.res_scale.hidden_states_bias";
  ZAYA_ASSERT(starts_with(native, "model.layers."));
  const size_t dot = native.find('.', 13);
  ZAYA_ASSERT(dot != std::string::npos);
  const int64_t i = std::stoll(native.substr(13, dot - 13));
  const std::string rest = native.substr(dot + 1);
  // A legacy half-layer's res_scale merges the previous half-layer's output into the residual at
  // its START: the MoE half-layer 2i+1's is layer i's post-attention scale, the attention
  // half-layer 2i+2's (or, after the last layer, model.res_scale) layer i's post-MLP scale.
  if (starts_with(rest, "post_attention_residual_scale."))
    return half(2 * i + 1) + "res_scale." + rest.substr(30);
  if (starts_with(rest, "post_mlp_residual_scale.")) {
    const std::string part = rest.substr(24);
    return i + 1 < layers ? half(2 * i + 2) + "res_scale." + part : "model.res_scale." + part;
  }
  if (rest == "mlp.experts.gate_up_proj" || rest == "mlp.experts.down_proj") {
    ZAYA_ASSERT(expert >= 0);
    return half(2 * i + 1) + "zaya_block.experts.local_experts." + std::to_string(expert) +
           (rest == "mlp.experts.gate_up_proj" ? ".linear_fc1.weight" : ".linear_fc2.weight");
  }
  for (const Rename& r : kLayerRenames)
    if (rest == r.native) return half(r.moe_half ? 2 * i + 1 : 2 * i) + r.legacy;
  ZAYA_ASSERT(false && "a native parameter without a legacy name");
  return {};
}

void load_legacy_hf_weights(const fs::path& dir, const std::vector<fs::path>& files, model::ZayaModel& m) {
  const model::ModelConfig& c = m.config();
  const int64_t L = c.num_hidden_layers;
  // Every legacy tensor the mapping expects, with the (view of the) native tensor it fills.
  struct Dest {
    Tensor t;
    std::string native;
  };
  std::map<std::string, Dest> want;
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const std::string& name = m.specs()[i].name;
    const Tensor& p = m.param(static_cast<int>(i));
    if (name.ends_with("mlp.experts.gate_up_proj") || name.ends_with("mlp.experts.down_proj")) {
      // Stacked [E, ...] from one [2I, H] (fc1: gate rows, then up rows, as the native order) or
      // [H, I] (fc2) matrix per expert.
      for (int64_t e = 0; e < c.num_experts; ++e)
        want[legacy_tensor_name(name, L, e)] = {p.select(e), name + "[" + std::to_string(e) + "]"};
    } else {
      want[legacy_tensor_name(name, L)] = {p, name};
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    const std::string name = model::balancing_bias_name(static_cast<int>(l));
    want[legacy_tensor_name(name, L)] = {m.balancing_biases().select(l), name};
  }

  std::set<std::string> loaded;
  std::vector<std::pair<std::string, Tensor>> lm_heads;
  for (const fs::path& file : files) {
    SafetensorsFile f(file);
    for (const StTensorInfo& info : f.header().tensors) {
      ZAYA_CHECK(!loaded.count(info.name), "tensor '", info.name, "' appears twice (again in ", file.string(), ")");
      loaded.insert(info.name);
      if (info.name == "lm_head.weight") {
        Tensor t = Tensor::empty(Shape{c.vocab_size, c.hidden_size}, DType::f32);
        copy_hf_tensor(f, info, t);
        lm_heads.push_back({file.string(), t});
        continue;
      }
      auto it = want.find(info.name);
      if (it == want.end()) {
        const bool native = m.param_index(info.name) >= 0;
        throw Error(str("tensor '", info.name, "' does not map into the native model: ",
                        native ? "it is a native-layout name, but config.json is in the legacy layout"
                               : "it is not a tensor of the legacy layout for this config.json (a leftover)"),
                    {.file = file.string(), .field = info.name,
                     .expected = "a legacy ZAYA1 tensor name (docs/legacy-import.md lists them)"});
      }
      copy_hf_tensor(f, info, it->second.t);
    }
  }
  for (const auto& [legacy, d] : want)
    ZAYA_CHECK(loaded.count(legacy), "missing tensor '", legacy, "' (native ", d.native, " ", d.t.shape().str(),
               ") in the legacy-layout directory ", dir.string());
  for (auto& [file, t] : lm_heads)
    ZAYA_CHECK(std::memcmp(t.raw(), m.param(0).raw(), t.nbytes()) == 0, file,
               ": lm_head.weight differs from model.embed_tokens.weight, but ZAYA1 ties them");

  // Imported with skip_passthrough on (model::legacy_hf_config), the model computes the legacy
  // MoE's skip path too. Only a model built without it (a caller's own config) differs there.
  if (!c.skip_passthrough) {
    const std::vector<int64_t> can_skip = skip_class_winning_layers(m);
    if (!can_skip.empty())
      log_warn("legacy import of ", dir.string(), ": in layer(s) ", layer_list(can_skip),
               " the balancing biases let the skip class win; this model has skip_passthrough off, so a token "
               "routed there gets MoE output 0, where the legacy model passed p_skip times its normalized input "
               "through (docs/legacy-import.md, \"The skip class\")");
  }
}

}  // namespace zaya::ckpt
