#include "zaya/sizing/model_gemms.h"

#include <algorithm>

namespace zaya::sizing {

const char* gemm_pass_name(GemmPass p) {
  switch (p) {
    case GemmPass::forward: return "fwd";
    case GemmPass::backward_data: return "bwd_data";
    case GemmPass::backward_weight: return "bwd_weight";
  }
  return "?";
}

std::vector<ModelGemm> model_gemms(const model::ModelConfig& c, int64_t tokens, int64_t top_k) {
  const int64_t L = c.num_hidden_layers, E = c.num_experts, H = c.hidden_size, R = c.router_hidden_size;
  // Balanced routing: each expert sees tokens·k/E rows (the ideal the balancing biases aim for).
  const int64_t per_expert = std::max<int64_t>(1, tokens * top_k / E);
  std::vector<ModelGemm> out;
  auto linear = [&](const std::string& name, int64_t rows, int64_t in, int64_t outf, int64_t count) {
    out.push_back({name, GemmPass::forward, rows, outf, in, count});
    out.push_back({name, GemmPass::backward_data, rows, in, outf, count});
    out.push_back({name, GemmPass::backward_weight, outf, in, rows, count});
  };
  linear("qkv_proj", tokens, H, c.q_dim() + 2 * c.kv_dim(), L);
  linear("o_proj", tokens, c.q_dim(), H, L);
  linear("router.down_proj", tokens, H, R, L);
  linear("router.fc1", tokens, R, R, L);
  linear("router.fc2", tokens, R, R, L);
  linear("router.out_proj", tokens, R, c.router_classes(), L);
  linear("expert.gate_up", per_expert, H, 2 * c.moe_intermediate_size, L * E);
  linear("expert.down", per_expert, c.moe_intermediate_size, H, L * E);
  linear("lm_head", tokens, H, c.vocab_size, 1);
  return out;
}

double attention_flops(const model::ModelConfig& c, int64_t tokens, int64_t seq) {
  return 6.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(tokens) * static_cast<double>(seq) *
         static_cast<double>(c.q_dim());
}

double predicted_compute_seconds(const model::ModelConfig& c, int64_t tokens, int64_t seq, const HardwareProfile& hw,
                                 int64_t top_k) {
  double t = 0;
  for (const auto& g : model_gemms(c, tokens, top_k)) t += g.flops() / gemm_rate(hw, g.m, g.n, g.k);
  t += attention_flops(c, tokens, seq) / gemm_rate(hw, seq, seq, c.head_dim);
  return t;
}

}  // namespace zaya::sizing
