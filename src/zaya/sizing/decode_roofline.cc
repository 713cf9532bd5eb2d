#include "zaya/sizing/decode_roofline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::sizing {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

// The model's parameters split as a decode step reads them (parameter_specs: the same list the
// model allocates).
struct ParamSplit {
  double dense = 0;       // non-expert, non-embedding parameters
  double per_expert = 0;  // one expert's matrices, summed over the layers
  double embedding = 0;
};
ParamSplit split_parameters(const model::ModelConfig& c) {
  ParamSplit s;
  for (const auto& p : model::parameter_specs(c)) {
    const double n = d(p.shape.numel());
    if (p.role == model::ParamRole::embedding) s.embedding += n;
    else if (p.is_expert()) s.per_expert += n / d(c.num_experts);
    else s.dense += n;
  }
  return s;
}

void check_options(const model::ModelConfig& c, const ServeOptions& o) {
  ZAYA_CHECK(o.weight_bytes >= 1 && o.cache_bytes >= 1, "serving cost: bytes per element must be >= 1, found weights ",
             o.weight_bytes, ", cache ", o.cache_bytes);
  ZAYA_CHECK(o.top_k >= 1 && o.top_k <= c.num_experts, "serving cost: top_k must be in [1, num_experts = ", c.num_experts,
             "], found ", o.top_k);
}

// The forward GEMMs of `rows` tokens with `distinct` experts hit per layer (each at rows·k/distinct
// rows), the head at `head_rows`, at the profile's rates: seconds and FLOPs of all of them, and the
// expert GEMMs' share of each.
struct ForwardGemms {
  double seconds = 0, flops = 0;
  double expert_seconds = 0, expert_flops = 0;
};
ForwardGemms forward_gemms(const model::ModelConfig& c, int64_t rows, int64_t head_rows, double distinct, int64_t k,
                           const HardwareProfile& hw) {
  const int64_t L = c.num_hidden_layers, H = c.hidden_size, R = c.router_hidden_size, I = c.moe_intermediate_size;
  ForwardGemms g;
  auto add = [&](int64_t m, int64_t n, int64_t kk, double count) {
    const double fl = 2.0 * d(m) * d(n) * d(kk) * count;
    g.flops += fl;
    g.seconds += fl / gemm_rate_at_shape(hw, m, n, kk);
  };
  add(rows, c.q_dim() + 2 * c.kv_dim(), H, d(L));
  add(rows, H, c.q_dim(), d(L));
  add(rows, R, H, d(L));
  add(rows, R, R, 2.0 * d(L));
  add(rows, c.router_classes(), R, d(L));
  // Expert GEMMs: rows·k tokens spread over `distinct` experts. The FLOPs are exact (rows·k per
  // layer); the rate is that of the average expert's GEMM, rounded to whole rows.
  const double per = d(rows) * d(k) / distinct;
  const int64_t m_e = std::max<int64_t>(1, std::llround(per));
  auto add_expert = [&](int64_t n, int64_t kk) {
    const double fl = 2.0 * per * d(n) * d(kk) * distinct * d(L);
    const double t = fl / gemm_rate_at_shape(hw, m_e, n, kk);
    g.flops += fl;
    g.seconds += t;
    g.expert_flops += fl;
    g.expert_seconds += t;
  };
  add_expert(2 * I, H);
  add_expert(H, I);
  add(head_rows, c.vocab_size, H, 1.0);
  return g;
}

// What the serving report says about how the decode rows price the experts.
// (A fitting entry prices every batch: measured_experts_seconds extrapolates past the measured counts.)
std::string experts_pricing(const model::ModelConfig& c, const HardwareProfile& hw, const ServeOptions& o) {
  const std::string shape = std::to_string(c.num_experts) + " experts of H " + std::to_string(c.hidden_size) +
                            ", I " + std::to_string(c.moe_intermediate_size) + " at " +
                            std::to_string(o.weight_bytes) + "-byte weights";
  if (hw.experts_table.empty())
    return "roofline (the profile has no experts_table; `zaya bench gemm --experts-tokens` measures one)";
  if (!o.measured_experts) return "roofline (shapes compared: one pricing for all)";
  if (o.top_k != 1) return "roofline (the profile's experts_table is measured at top-1; this is top-" + std::to_string(o.top_k) + ")";
  std::string tokens;
  for (const auto& x : hw.experts_table)
    if (x.experts == c.num_experts && x.hidden == c.hidden_size && x.intermediate == c.moe_intermediate_size &&
        experts_weight_bytes(x.weight_dtype) == o.weight_bytes)
      tokens += (tokens.empty() ? "" : ", ") + std::to_string(x.tokens);
  if (tokens.empty()) return "roofline (the profile's experts_table has no entry for " + shape + ")";
  return "measured: ops::experts_forward of " + shape +
         " from the profile's experts_table (tokens " + tokens +
         "); step = max(mem, comp) of the rest + experts";
}

}  // namespace

double expected_distinct_experts(int64_t experts, double tokens, int64_t top_k) {
  ZAYA_CHECK(experts >= 1 && top_k >= 1 && top_k <= experts && tokens >= 0,
             "expected_distinct_experts: need 1 <= top_k <= experts and tokens >= 0, found experts ", experts,
             ", top_k ", top_k, ", tokens ", tokens);
  const double E = d(experts);
  return E * (1.0 - std::pow(1.0 - d(top_k) / E, tokens));
}

WeightBytes decode_weight_bytes(const model::ModelConfig& c, double distinct_experts, const ServeOptions& o) {
  const ParamSplit s = split_parameters(c);
  const double b = d(o.weight_bytes);
  WeightBytes w;
  w.dense = (s.dense + d(c.num_hidden_layers * c.router_classes())) * b;  // + balancing biases
  w.experts = s.per_expert * distinct_experts * b;
  w.lm_head = s.embedding * b;
  return w;
}

CacheBytes cache_bytes_per_sequence(const model::ModelConfig& c, int64_t context, const ServeOptions& o) {
  const double L = d(c.num_hidden_layers), b = d(o.cache_bytes);
  CacheBytes r;
  r.kv = L * 2.0 * d(context) * d(c.kv_dim()) * b;
  r.cca_state = L * (2.0 * d(c.conv_channels()) + d(c.kv_dim() / 2)) * b;
  r.mha_kv = L * 2.0 * d(context) * d(c.hidden_size) * b;
  return r;
}

double decode_params_per_token(const model::ModelConfig& c, int64_t top_k) {
  const ParamSplit s = split_parameters(c);
  return s.dense + d(top_k) * s.per_expert + s.embedding;
}

DecodeStep decode_step(const model::ModelConfig& c, int64_t batch, int64_t context, const HardwareProfile* hw,
                       const ServeOptions& o) {
  check_options(c, o);
  ZAYA_CHECK(batch >= 1 && context >= 1, "decode_step: batch and context must be >= 1, found ", batch, ", ", context);
  DecodeStep s;
  s.batch = batch;
  s.context = context;
  s.distinct_experts = expected_distinct_experts(c.num_experts, d(batch), o.top_k);
  s.weights = decode_weight_bytes(c, s.distinct_experts, o);
  const CacheBytes cb = cache_bytes_per_sequence(c, context, o);
  s.kv_bytes = d(batch) * cb.kv;
  s.state_bytes = 2.0 * d(batch) * cb.cca_state;  // read, then written back
  const double attention = 4.0 * d(batch) * d(c.num_hidden_layers) * d(context) * d(c.q_dim());
  s.flops = 2.0 * d(batch) * decode_params_per_token(c, o.top_k) + attention;
  if (hw) {
    const ForwardGemms g = forward_gemms(c, batch, batch, s.distinct_experts, o.top_k, *hw);
    // Attention: each kv head's G query rows against the cache, a [G, ctx, hd] product per head.
    const double attention_s = attention / gemm_rate(*hw, c.group_size(), context, c.head_dim);
    // What is neither (norms, conv, scales) at the large-GEMM rate: a few percent at most.
    const double other_s = std::max(0.0, s.flops - g.flops - attention) / hw->achievable_flops;
    // The experts op as the profile measured it (top-1 only: the measurement routes one expert per
    // token): its wall time already holds its weights' streaming and its FLOPs, so it is taken out
    // of the roofline and added to the rest's max(memory, compute) (the ops run one after another).
    double measured = -1;
    if (o.top_k == 1 && o.measured_experts)
      measured = measured_experts_seconds(*hw, c.num_experts, c.hidden_size, c.moe_intermediate_size, o.weight_bytes,
                                          d(batch), s.distinct_experts);
    if (measured >= 0) {
      s.experts_measured = true;
      s.experts_s = d(c.num_hidden_layers) * measured;
      s.memory_s = (s.bytes() - s.weights.experts) / hw->memory_bandwidth;
      s.compute_s = (g.seconds - g.expert_seconds) + attention_s + other_s;
    } else {
      s.memory_s = s.bytes() / hw->memory_bandwidth;
      s.compute_s = g.seconds + attention_s + other_s;
    }
    s.step_s = std::max(s.memory_s, s.compute_s) + s.experts_s;
  }
  return s;
}

Prefill prefill_cost(const model::ModelConfig& c, int64_t prompt, const HardwareProfile* hw, const ServeOptions& o) {
  check_options(c, o);
  ZAYA_CHECK(prompt >= 1, "prefill: the prompt length must be >= 1, found ", prompt);
  Prefill p;
  p.prompt = prompt;
  p.distinct_experts = expected_distinct_experts(c.num_experts, d(prompt), o.top_k);
  const CacheBytes cb = cache_bytes_per_sequence(c, prompt, o);
  p.bytes = decode_weight_bytes(c, p.distinct_experts, o).total() + cb.total();
  const double head = d(c.vocab_size) * d(c.hidden_size);
  const double attention = 2.0 * d(c.num_hidden_layers) * d(c.q_dim()) * d(prompt) * d(prompt + 1);
  p.flops = 2.0 * d(prompt) * (decode_params_per_token(c, o.top_k) - head) + 2.0 * head + attention;
  if (hw) {
    p.memory_s = p.bytes / hw->memory_bandwidth;
    const ForwardGemms g = forward_gemms(c, prompt, 1, p.distinct_experts, o.top_k, *hw);
    p.compute_s = g.seconds + attention / gemm_rate(*hw, prompt, prompt, c.head_dim);
    p.compute_s += std::max(0.0, p.flops - g.flops - attention) / hw->achievable_flops;
    p.time_s = std::max(p.memory_s, p.compute_s);
  }
  return p;
}

ServeReport serve_model(const model::ModelConfig& c, int64_t prompt, int64_t context,
                        const std::vector<int64_t>& batches, const HardwareProfile* hw, const ServeOptions& o) {
  check_options(c, o);
  ZAYA_CHECK(context >= 1, "serving cost: the decode context must be >= 1, found ", context);
  ServeReport r;
  r.options = o;
  r.prompt = prompt;
  r.context = context;
  // A measured profile may lack a bandwidth (a GEMM-only measurement): counts without times then.
  if (hw && !(hw->memory_bandwidth > 0)) {
    r.hw_name = hw->name;
    hw = nullptr;
  }
  r.prefill = prefill_cost(c, prompt, hw, o);
  for (int64_t b : batches) r.decode.push_back(decode_step(c, b, context, hw, o));
  r.cache = cache_bytes_per_sequence(c, context, o);
  r.all_weight_bytes = decode_weight_bytes(c, d(c.num_experts), o).total();
  if (hw) {
    r.has_hw = true;
    r.hw_name = hw->name;
    const double room = hw->memory_bytes - r.all_weight_bytes;
    r.max_batch = room > 0 ? static_cast<int64_t>(room / r.cache.total()) : 0;
    r.experts_pricing = experts_pricing(c, *hw, o);
  }
  return r;
}

namespace {
std::string fixed3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}
}  // namespace

std::string format_serve_report(const ServeReport& r) {
  std::ostringstream o;
  char line[320];
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::snprintf(line, sizeof line,
                "serving        weights %lld B/element, cache %lld B/element, top-%lld; decode reads the experts "
                "hit: E·(1 − (1 − k/E)^B) per layer\n",
                static_cast<long long>(r.options.weight_bytes), static_cast<long long>(r.options.cache_bytes),
                static_cast<long long>(r.options.top_k));
  o << line;
  std::snprintf(line, sizeof line, "kv cache/seq   %.1f MiB at %lld positions + CCA state %.1f KiB; full MHA %.1f MiB (%.1fx more)\n",
                r.cache.kv / (1024.0 * 1024.0), static_cast<long long>(r.context), r.cache.cca_state / 1024.0,
                r.cache.mha_kv / (1024.0 * 1024.0), r.cache.ratio_vs_mha());
  o << line;
  std::snprintf(line, sizeof line, "prefill        %lld tokens: %.3f TFLOP, %.2f GiB read/written", static_cast<long long>(r.prompt),
                r.prefill.flops / 1e12, r.prefill.bytes / gib);
  o << line;
  if (r.has_hw) {
    std::snprintf(line, sizeof line, ": %.2f ms on %s (%s-bound)", 1e3 * r.prefill.time_s, r.hw_name.c_str(),
                  r.prefill.memory_s >= r.prefill.compute_s ? "memory" : "compute");
    o << line;
  }
  o << "\n";
  const std::string no_times = r.hw_name.empty() ? " (no --hw: bytes and FLOPs only)"
                                                 : " (" + r.hw_name + " has no memory_bandwidth: bytes and FLOPs only)";
  std::snprintf(line, sizeof line, "decode         at %lld positions per sequence%s\n", static_cast<long long>(r.context),
                r.has_hw ? "" : no_times.c_str());
  o << line;
  // The experts column appears only when a row prices the experts by the profile's measurement, so
  // the report of a profile without one reads as before.
  const bool experts_column =
      std::any_of(r.decode.begin(), r.decode.end(), [](const DecodeStep& s) { return s.experts_measured; });
  if (experts_column)
    std::snprintf(line, sizeof line, "  %6s %8s %12s %12s %10s %10s %10s %12s %10s %12s %7s\n", "batch", "experts",
                  "weights", "kv+state", "GFLOP", "mem (ms)", "comp (ms)", "experts (ms)", "step (ms)", "tokens/s",
                  "bound");
  else
    std::snprintf(line, sizeof line, "  %6s %8s %12s %12s %10s %10s %10s %10s %12s %7s\n", "batch", "experts", "weights",
                  "kv+state", "GFLOP", "mem (ms)", "comp (ms)", "step (ms)", "tokens/s", "bound");
  o << line;
  for (const auto& s : r.decode) {
    const char* bound = r.has_hw ? s.bound() : "-";
    if (experts_column)
      std::snprintf(line, sizeof line, "  %6lld %8.2f %8.2f GiB %8.2f GiB %10.2f %10.3f %10.3f %12s %10.3f %12.1f %7s\n",
                    static_cast<long long>(s.batch), s.distinct_experts, s.weights.total() / gib,
                    (s.kv_bytes + s.state_bytes) / gib, s.flops / 1e9, 1e3 * s.memory_s, 1e3 * s.compute_s,
                    s.experts_measured ? fixed3(1e3 * s.experts_s).c_str() : "roofline", 1e3 * s.step_s,
                    s.tokens_per_s(), bound);
    else
      std::snprintf(line, sizeof line, "  %6lld %8.2f %8.2f GiB %8.2f GiB %10.2f %10.3f %10.3f %10.3f %12.1f %7s\n",
                    static_cast<long long>(s.batch), s.distinct_experts, s.weights.total() / gib,
                    (s.kv_bytes + s.state_bytes) / gib, s.flops / 1e9, 1e3 * s.memory_s, 1e3 * s.compute_s,
                    1e3 * s.step_s, s.tokens_per_s(), bound);
    o << line;
  }
  if (r.has_hw) {
    std::snprintf(line, sizeof line, "  step = max(mem, comp)%s: each sequence's latency per token; weights held %.2f GiB; %lld sequences of %lld "
                  "positions fit beside them\n", experts_column ? " + experts" : "", r.all_weight_bytes / gib,
                  static_cast<long long>(r.max_batch), static_cast<long long>(r.context));
    o << line;
    o << "  experts: " << r.experts_pricing << "\n";
  }
  return o.str();
}

}  // namespace zaya::sizing
