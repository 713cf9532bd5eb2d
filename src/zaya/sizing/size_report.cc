#include "zaya/sizing/size_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::sizing {
namespace {

std::string billions(int64_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "%.3fB (%lld)", static_cast<double>(n) / 1e9, static_cast<long long>(n));
  return b;
}
std::string gib(double bytes) {
  char b[64];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return b;
}

RuleCheck multiple_of(const std::string& what, int64_t v, int64_t m) {
  return {what + " = " + std::to_string(v) + " is a multiple of " + std::to_string(m), v % m == 0,
          v % m == 0 ? "" : "GEMM tiles and vector widths are multiples of 64: a remainder wastes a partial tile"};
}

}  // namespace

SizeReport size_model(const model::ModelConfig& c, const RunShape& run, const std::optional<HardwareProfile>& hw) {
  SizeReport r;
  r.config = c;
  r.run = run;
  r.hw = hw;
  model::ParamCounts n = model::count_parameters(c);
  r.total = n.total;
  r.embedding = n.embedding;
  r.non_embedding = n.non_embedding;
  r.active = n.active;
  r.flops_per_token = model::training_flops_per_token(c, run.seq);
  r.kv_cache_bytes_per_token = model::kv_cache_bytes_per_token(c, 2);

  // Mixed precision as ZAYA1 trains: bf16 weights, fp32 gradients, fp32 master weights and fp32
  // optimizer state (AdamW m and v; Muon one momentum); ZeRO-1 shards master + optimizer state.
  int64_t muon = 0;
  for (const auto& p : model::parameter_specs(c))
    if (p.role == model::ParamRole::matrix || p.role == model::ParamRole::expert_matrix) muon += p.shape.numel();
  int64_t adam = n.total - muon;
  double shard = run.zero >= 1 ? static_cast<double>(run.dp) : 1.0;
  r.memory.weights = 2.0 * static_cast<double>(n.total);
  r.memory.gradients = 4.0 * static_cast<double>(n.total);
  r.memory.optimizer = (4.0 * static_cast<double>(n.total) + 8.0 * static_cast<double>(adam) + 4.0 * static_cast<double>(muon)) / shard;
  const double L = static_cast<double>(c.num_hidden_layers), H = static_cast<double>(c.hidden_size),
               layer_saved = static_cast<double>(model::activation_bytes_per_token_per_layer(c, 2));
  if (run.recompute && c.num_hidden_layers > 1) {
    // As ZayaModel plans it: every layer keeps its fp32 input, its router state (compute dtype) and
    // its routing choice (int32); one layer's saved activations are shared, with a second u and
    // attention output (the layer above's weight gradients still read them during a re-run); plus
    // the final hidden state. The per-layer formula counts the layer input already.
    const double kept = 4.0 * H + 2.0 * static_cast<double>(c.router_hidden_size) + 4.0;
    r.memory.activations = static_cast<double>(run.mbs * run.seq) *
                           ((L - 1.0) * kept + layer_saved + 2.0 * (H + static_cast<double>(c.q_dim())) + 4.0 * H);
    // The re-run forwards of layers 0..L−2: a third of their training FLOPs (6 per active
    // parameter, 6·S·nq·hd of attention), the embedding and head not included.
    r.recompute_flops_per_token = (L - 1.0) / L *
                                  (2.0 * static_cast<double>(n.active) +
                                   2.0 * L * static_cast<double>(run.seq) * static_cast<double>(c.q_dim()));
  } else {
    r.memory.activations = static_cast<double>(run.mbs * run.seq) * (L * layer_saved + 4.0 * H);
  }

  const int64_t tokens = run.mbs * run.seq;
  r.rules.push_back(multiple_of("hidden_size", c.hidden_size, 64));
  r.rules.push_back({"head_dim = " + std::to_string(c.head_dim) + " is 64 or 128", c.head_dim == 64 || c.head_dim == 128,
                     c.head_dim == 64 || c.head_dim == 128 ? "" : "attention kernels are tuned for 64/128-wide heads"});
  r.rules.push_back(multiple_of("vocab_size", c.vocab_size, 64));
  r.rules.push_back(multiple_of("tokens per micro-batch", tokens, 64));
  r.rules.push_back(multiple_of("moe_intermediate_size", c.moe_intermediate_size, 64));
  r.rules.push_back(multiple_of("router_hidden_size", c.router_hidden_size, 64));
  int64_t per_expert = tokens / c.num_experts;
  bool big = per_expert >= 1024 && c.hidden_size >= 1024 && c.moe_intermediate_size >= 1024;
  r.rules.push_back({"expert GEMMs are large (tokens/expert " + std::to_string(per_expert) + ", H " +
                         std::to_string(c.hidden_size) + ", I " + std::to_string(c.moe_intermediate_size) + " all >= 1024)",
                     big, big ? "" : "small GEMMs stay far below the large-GEMM rate (memory- and launch-bound)", false});

  if (hw) {
    // Compute at the profile's large-GEMM rate, or GEMM by GEMM from its measured efficiency
    // table (model_gemms.h) when it has one; ZeRO-1 traffic per step: reduce-scatter of fp32
    // gradients plus all-gather of bf16 weights, each costing (n-1)/n * bytes / bw on a ring.
    r.compute_time_s = hw->gemm_table.empty() ? r.flops_per_token * static_cast<double>(tokens) / hw->achievable_flops
                                              : predicted_compute_seconds(c, tokens, run.seq, *hw);
    // Recompute: the step's time grows with its FLOPs (the re-run GEMMs are the forward's).
    r.compute_time_s *= 1.0 + r.recompute_flops_per_token / r.flops_per_token;
    if (run.dp > 1) {
      double f = static_cast<double>(run.dp - 1) / static_cast<double>(run.dp);
      double bw = run.dp > hw->gpus_per_node ? hw->inter_node_bandwidth : hw->intra_node_bandwidth;
      r.comm_time_s = f * (4.0 + 2.0) * static_cast<double>(n.total) / bw;
    }
    r.step_time_s = r.compute_time_s + r.comm_time_s;  // no overlap assumed: an upper bound
    r.mfu = r.flops_per_token * static_cast<double>(tokens) / (r.step_time_s * hw->peak_bf16_flops);
  }
  return r;
}

std::string format_size_report(const SizeReport& r) {
  const auto& c = r.config;
  std::ostringstream o;
  char line[256];
  o << "model          H " << c.hidden_size << ", L " << c.num_hidden_layers << ", heads " << c.num_attention_heads << "/"
    << c.num_key_value_heads << " x " << c.head_dim << ", experts " << c.num_experts << " x " << c.moe_intermediate_size
    << ", router " << c.router_hidden_size << ", vocab " << c.vocab_size << "\n";
  o << "parameters     total " << billions(r.total) << "\n"
    << "               non-embedding " << billions(r.non_embedding) << "\n"
    << "               active " << billions(r.active) << "\n"
    << "               embedding " << billions(r.embedding) << "\n";
  std::snprintf(line, sizeof line, "flops/token    %.3f GFLOP (training, seq %lld)\n", r.flops_per_token / 1e9,
                static_cast<long long>(r.run.seq));
  o << line;
  if (r.recompute_flops_per_token > 0) {
    std::snprintf(line, sizeof line, "recompute      +%.3f GFLOP per token (%.1f%% more: %lld layer forwards re-run)\n",
                  r.recompute_flops_per_token / 1e9, 100 * r.recompute_flops_per_token / r.flops_per_token,
                  static_cast<long long>(c.num_hidden_layers - 1));
    o << line;
  }
  o << "kv cache       " << r.kv_cache_bytes_per_token << " bytes per token (bf16, " << c.num_hidden_layers << " layers)\n";
  o << "memory/rank    (dp " << r.run.dp << ", micro-batch " << r.run.mbs << " x " << r.run.seq << ", ZeRO-" << r.run.zero << ")\n"
    << "               weights (bf16) " << gib(r.memory.weights) << "\n"
    << "               gradients (fp32) " << gib(r.memory.gradients) << "\n"
    << "               optimizer (fp32 master + state) " << gib(r.memory.optimizer) << "\n"
    << "               activations " << gib(r.memory.activations)
    << (r.run.recompute ? " (recomputed: layer inputs + one layer's saved activations)" : "") << "\n"
    << "               total " << gib(r.memory.total()) << "\n";
  if (r.hw) {
    std::snprintf(line, sizeof line, "step time      %.3f s on %s (compute %.3f s, ZeRO-1 communication %.3f s, no overlap)\n",
                  r.step_time_s, r.hw->name.c_str(), r.compute_time_s, r.comm_time_s);
    o << line;
    std::snprintf(line, sizeof line, "               compute priced %s\n",
                  r.hw->gemm_table.empty() ? "at the profile's achievable rate for every GEMM"
                                           : "GEMM by GEMM from the profile's measured efficiency table");
    o << line;
    std::snprintf(line, sizeof line, "mfu            %.1f%% of %.3g TFLOP/s\n", 100 * r.mfu, r.hw->peak_bf16_flops / 1e12);
    o << line;
    if (r.memory.total() > r.hw->memory_bytes)
      o << "warning        memory per rank exceeds the device's " << gib(r.hw->memory_bytes) << "\n";
  }
  o << "sizing rules\n";
  for (const auto& rule : r.rules)
    o << "  " << (rule.ok ? "✓ " : "✗ ") << rule.rule << (rule.ok ? "" : ": " + rule.reason) << "\n";
  return o.str();
}

std::string format_measured_step(const SizeReport& r, double measured_step_s) {
  ZAYA_CHECK(r.hw.has_value(), "--measured-step-s: a measured step is compared with a hardware profile's "
             "prediction; add --hw (h100, h200, mi300x or a profile .json)");
  ZAYA_CHECK(measured_step_s > 0 && std::isfinite(measured_step_s),
             "--measured-step-s: expected a positive number of seconds, found ", measured_step_s);
  const double tokens = static_cast<double>(r.run.mbs * r.run.seq);
  const double mfu = r.flops_per_token * tokens / (measured_step_s * r.hw->peak_bf16_flops);
  char line[320];
  std::ostringstream o;
  std::snprintf(line, sizeof line,
                "measured       step %.4g s against %.4g s predicted on %s (measured / predicted %.2f), "
                "%.0f tokens/s\n",
                measured_step_s, r.step_time_s, r.hw->name.c_str(), measured_step_s / r.step_time_s,
                tokens / measured_step_s);
  o << line;
  std::snprintf(line, sizeof line, "               mfu %.1f%% measured, %.1f%% predicted, of %.3g TFLOP/s\n", 100 * mfu,
                100 * r.mfu, r.hw->peak_bf16_flops / 1e12);
  o << line;
  return o.str();
}

}  // namespace zaya::sizing
