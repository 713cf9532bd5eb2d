#include "zaya/model/params.h"

#include <cmath>

namespace zaya::model {

std::string balancing_bias_name(int layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.gate.balancing_biases";
}

std::vector<ParamSpec> parameter_specs(const ModelConfig& c) {
  const int64_t H = c.hidden_size, nq = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t C = c.conv_channels(), E = c.num_experts, I = c.moe_intermediate_size, R = c.router_hidden_size;
  const float std = static_cast<float>(c.initializer_range);
  // Output projections (o_proj, expert down_proj) are scaled down by sqrt(2L) so the residual
  // stream's variance does not grow with depth (GPT-2 / Megatron "scaled init").
  const float out_std = std / std::sqrt(2.0f * static_cast<float>(c.num_hidden_layers));

  std::vector<ParamSpec> out;
  auto add = [&](std::string name, Shape shape, ParamRole role, InitKind init, float v, int layer) {
    out.push_back({std::move(name), shape, role, init, v, layer});
  };
  // RS(h, x) = (h + b_h) * s_h + (x + b_x) * s_x starts as the plain residual sum h + x.
  auto add_residual_scale = [&](const std::string& prefix, int l) {
    add(prefix + "hidden_states_scale", {H}, ParamRole::scale, InitKind::ones, 1, l);
    add(prefix + "hidden_states_bias", {H}, ParamRole::bias, InitKind::zeros, 0, l);
    add(prefix + "residual_scale", {H}, ParamRole::scale, InitKind::ones, 1, l);
    add(prefix + "residual_bias", {H}, ParamRole::bias, InitKind::zeros, 0, l);
  };
  add("model.embed_tokens.weight", {c.vocab_size, H}, ParamRole::embedding, InitKind::normal, std, -1);
  add("model.input_hidden_states_scale", {H}, ParamRole::scale, InitKind::ones, 1, -1);
  add("model.input_hidden_states_bias", {H}, ParamRole::bias, InitKind::zeros, 0, -1);

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    const std::string qkv = a + "qkv_proj.";
    add(p + "input_layernorm.weight", {H}, ParamRole::norm_weight, InitKind::ones, 1, l);
    add(qkv + "q_proj.weight", {nq * hd, H}, ParamRole::matrix, InitKind::normal, std, l);
    add(qkv + "k_proj.weight", {nkv * hd, H}, ParamRole::matrix, InitKind::normal, std, l);
    add(qkv + "v_proj_current.weight", {nkv * hd / 2, H}, ParamRole::matrix, InitKind::normal, std, l);
    add(qkv + "v_proj_delayed.weight", {nkv * hd / 2, H}, ParamRole::matrix, InitKind::normal, std, l);
    // Conv kernels: PyTorch's Conv1d default, which HF keeps, is uniform(±1/sqrt(fan_in)) with
    // fan_in = channels per group * kernel; we draw a normal of the same variance, 1/(3 fan_in).
    add(qkv + "conv_qk_depthwise.weight", {C, 1, 2}, ParamRole::conv_weight, InitKind::normal,
        1.0f / std::sqrt(3.0f * 2.0f), l);
    add(qkv + "conv_qk_depthwise.bias", {C}, ParamRole::bias, InitKind::zeros, 0, l);
    add(qkv + "conv_qk_grouped.weight", {C, hd, 2}, ParamRole::conv_weight, InitKind::normal,
        1.0f / std::sqrt(3.0f * static_cast<float>(2 * hd)), l);
    add(qkv + "conv_qk_grouped.bias", {C}, ParamRole::bias, InitKind::zeros, 0, l);
    add(a + "qk_norm.temp", {nkv}, ParamRole::temperature, InitKind::constant,
        static_cast<float>(c.key_temperature_init), l);
    add(a + "o_proj.weight", {H, nq * hd}, ParamRole::matrix, InitKind::normal, out_std, l);
    add_residual_scale(p + "post_attention_residual_scale.", l);
    add(p + "post_attention_layernorm.weight", {H}, ParamRole::norm_weight, InitKind::ones, 1, l);
    const std::string g = p + "mlp.gate.";
    add(g + "down_proj.weight", {R, H}, ParamRole::matrix, InitKind::normal, std, l);
    add(g + "down_proj.bias", {R}, ParamRole::bias, InitKind::zeros, 0, l);
    if (l > 0) add(g + "router_states_scale", {R}, ParamRole::scale, InitKind::ones, 1, l);
    add(g + "router_mlp.norm.weight", {R}, ParamRole::norm_weight, InitKind::ones, 1, l);
    add(g + "router_mlp.fc1.weight", {R, R}, ParamRole::matrix, InitKind::normal, std, l);
    add(g + "router_mlp.fc1.bias", {R}, ParamRole::bias, InitKind::zeros, 0, l);
    add(g + "router_mlp.fc2.weight", {R, R}, ParamRole::matrix, InitKind::normal, std, l);
    add(g + "router_mlp.fc2.bias", {R}, ParamRole::bias, InitKind::zeros, 0, l);
    add(g + "router_mlp.out_proj.weight", {E + 1, R}, ParamRole::matrix, InitKind::normal, std, l);
    add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, ParamRole::expert_matrix, InitKind::normal, std, l);
    add(p + "mlp.experts.down_proj", {E, H, I}, ParamRole::expert_matrix, InitKind::normal, out_std, l);
    add_residual_scale(p + "post_mlp_residual_scale.", l);
  }
  add("model.norm.weight", {H}, ParamRole::norm_weight, InitKind::ones, 1, -1);
  return out;
}

ParamCounts count_parameters(const ModelConfig& c) {
  ParamCounts n;
  for (const ParamSpec& p : parameter_specs(c)) {
    int64_t k = p.shape.numel();
    n.total += k;
    if (p.role == ParamRole::embedding) n.embedding += k;
    if (p.is_expert()) n.expert += k;
  }
  n.non_embedding = n.total - n.embedding;
  // Top-1 routing: a token touches one expert's matrices in each layer.
  n.active = n.non_embedding - n.expert + n.expert / c.num_experts;
  return n;
}

double training_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  ParamCounts n = count_parameters(c);
  double matmul_params = static_cast<double>(n.active) + static_cast<double>(n.embedding);  // + tied LM head
  double attention = 6.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(seq_len) *
                     static_cast<double>(c.q_dim());
  return 6.0 * matmul_params + attention;
}

int64_t activation_bytes_per_token_per_layer(const ModelConfig& c, int64_t b) {
  const int64_t H = c.hidden_size, C = c.conv_channels(), R = c.router_hidden_size, I = c.moe_intermediate_size;
  // What ZayaModel saves per token (docs/model.md derives it). Compute dtype: the norm outputs u and
  // w, the attention and MoE outputs (residual-scale backward needs them), the expert input and
  // output (4H); z, q and k after the conv and after norm + RoPE (3C); v; the attention output; the
  // router's h, r, z and the fc1/fc2 pre- and post-GELU values (6R); router probabilities (E + 1); the
  // expert gate_up and SwiGLU output (3I).
  int64_t compute = 6 * H + 3 * C + c.kv_dim() + c.q_dim() + 6 * R + c.router_classes() + 3 * I;
  // fp32: the layer input and x_mid (residual stream), the attention logsumexp (nq), three norms'
  // rstd, the routing weight and three int32 routing indices.
  int64_t fp32 = 2 * H + c.num_attention_heads + 3 + 4;
  return compute * b + fp32 * 4;
}

int64_t kv_cache_bytes_per_token(const ModelConfig& c, int64_t bytes_per_element) {
  return c.num_hidden_layers * 2 * c.kv_dim() * bytes_per_element;
}

std::vector<std::pair<std::string, Shape>> weight_shapes(const ModelConfig& c) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const ParamSpec& s : parameter_specs(c)) out.emplace_back(s.name, s.shape);
  for (int l = 0; l < c.num_hidden_layers; ++l) out.emplace_back(balancing_bias_name(l), Shape{c.num_experts + 1});
  return out;
}

std::vector<std::pair<int64_t, int64_t>> gradient_report_order(const std::vector<ParamSpec>& specs) {
  std::vector<std::pair<int64_t, int64_t>> layers;
  int64_t off = 0, norm_begin = -1, norm_end = -1;
  for (const ParamSpec& s : specs) {
    const int64_t n = s.shape.numel();
    if (s.layer >= 0) {
      if (static_cast<size_t>(s.layer) >= layers.size()) layers.resize(static_cast<size_t>(s.layer) + 1, {-1, -1});
      auto& [b, e] = layers[static_cast<size_t>(s.layer)];
      if (b < 0) b = off;
      ZAYA_CHECK(e < 0 || e == off, "gradient_report_order: layer ", s.layer, "'s parameters are not contiguous (", s.name, ")");
      e = off + n;
    } else if (s.name == "model.norm.weight") {
      norm_begin = off, norm_end = off + n;
    }
    off += n;
  }
  ZAYA_CHECK(norm_begin >= 0, "gradient_report_order: no model.norm.weight");
  std::vector<std::pair<int64_t, int64_t>> order{{norm_begin, norm_end}};
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) order.push_back(*it);
  order.emplace_back(0, layers.empty() ? norm_begin : layers[0].first);
  return order;
}

}  // namespace zaya::model
