#include "zaya/sizing/expert_sweep.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::sizing {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

int64_t active_parameters(const model::ModelConfig& c, int64_t top_k) {
  const auto n = model::count_parameters(c);
  return n.non_embedding - n.expert + top_k * (n.expert / c.num_experts);
}

}  // namespace

double training_compute_seconds(const model::ModelConfig& c, const RunShape& run, const HardwareProfile& hw, int64_t top_k) {
  const int64_t tokens = run.mbs * run.seq;
  if (!hw.gemm_table.empty()) return predicted_compute_seconds(c, tokens, run.seq, hw, top_k);
  const double flops = 6.0 * d(tokens) * decode_params_per_token(c, top_k) + attention_flops(c, tokens, run.seq);
  return flops / hw.achievable_flops;
}

std::vector<ExpertSweepRow> sweep_experts(const model::ModelConfig& c, const RunShape& run, const HardwareProfile& hw,
                                          const ExpertSweepOptions& o) {
  ZAYA_CHECK(hw.memory_bandwidth > 0, "--sweep-experts prices decode by memory bandwidth, and the profile ", hw.name,
             " has none (memory_bandwidth ", hw.memory_bandwidth, "): add it to the profile");
  ZAYA_CHECK(!o.decode_batches.empty(), "--sweep-experts: no decode batch sizes");
  const int64_t E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t context = o.context > 0 ? o.context : run.seq;
  std::vector<ExpertSweepRow> rows;
  auto add = [&](const std::string& family, int64_t experts, int64_t width, int64_t k) {
    if (experts < 1 || width < 1 || k > experts) return;
    model::ModelConfig m = c;
    m.num_experts = experts;
    m.moe_intermediate_size = width;
    ExpertSweepRow r;
    r.family = family;
    r.config = m;
    r.top_k = k;
    r.is_original = experts == E && width == I && k == 1;
    r.total = model::count_parameters(m).total;
    r.active = active_parameters(m, k);
    const SizeReport base = size_model(m, run, hw);
    r.train_compute_s = training_compute_seconds(m, run, hw, k);
    r.train_step_s = r.train_compute_s + base.comm_time_s;
    // size_model counts one expert's activations per token (3I: gate_up and the SwiGLU output);
    // a top-k token keeps k of them plus a permuted input and output row (2H) for each extra one.
    r.train_memory_bytes = base.memory.total() + d(k - 1) * d(run.mbs * run.seq) * d(m.num_hidden_layers) *
                                                     d(3 * width + 2 * m.hidden_size) * 2.0;
    ServeOptions so = o.serve;
    so.top_k = k;
    so.measured_experts = false;  // every shape priced alike (ServeOptions)
    for (int64_t b : o.decode_batches) r.decode.push_back(decode_step(m, b, context, &hw, so));
    r.serve_weight_bytes = decode_weight_bytes(m, d(experts), so).total();
    rows.push_back(std::move(r));
  };
  for (int64_t g : {1, 2, 4, 8})
    if (I % g == 0) add("fine-grained", E * g, I / g, g);
  for (int64_t f : {4, 2}) {
    if (E % f == 0) add("count", E / f, I, 1);
  }
  for (int64_t f : {2, 4}) add("count", E * f, I, 1);
  for (int64_t f : {2, 4})
    if (E % f == 0) add("coarse", E / f, I * f, 1);
  return rows;
}

std::string format_expert_sweep(const std::vector<ExpertSweepRow>& rows, const HardwareProfile& hw,
                                const ExpertSweepOptions& o) {
  std::ostringstream out;
  char line[400];
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const int64_t context = rows.empty() || rows[0].decode.empty() ? 0 : rows[0].decode[0].context;
  std::snprintf(line, sizeof line,
                "expert sweep   on %s; fine-grained: fixed active and total; count: fixed active; coarse: fixed total; "
                "decode at %lld positions\n",
                hw.name.c_str(), static_cast<long long>(context));
  out << line;
  std::snprintf(line, sizeof line, "  %-12s %5s %6s %3s %9s %9s %10s", "family", "E", "I", "k", "total", "active", "train (s)");
  out << line;
  for (int64_t b : o.decode_batches) {
    char head[32];
    std::snprintf(head, sizeof head, "b%lld (ms)", static_cast<long long>(b));
    std::snprintf(line, sizeof line, " %9s", head);
    out << line;
  }
  std::snprintf(line, sizeof line, " %12s %12s %13s %s\n", ("tok/s b" + std::to_string(o.decode_batches.back())).c_str(),
                "train GiB", "serve W GiB", "note");
  out << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "  %-12s %5lld %6lld %3lld %8.3fB %8.3fB %10.4f", r.family.c_str(),
                  static_cast<long long>(r.config.num_experts), static_cast<long long>(r.config.moe_intermediate_size),
                  static_cast<long long>(r.top_k), d(r.total) / 1e9, d(r.active) / 1e9, r.train_step_s);
    out << line;
    for (const auto& s : r.decode) {
      std::snprintf(line, sizeof line, " %9.3f", 1e3 * s.step_s);
      out << line;
    }
    std::snprintf(line, sizeof line, " %12.1f %12.2f %13.2f %s\n", r.decode.back().tokens_per_s(),
                  r.train_memory_bytes / gib, r.serve_weight_bytes / gib, r.is_original ? "original" : "");
    out << line;
  }
  return out.str();
}

std::string expert_sweep_json(const std::vector<ExpertSweepRow>& rows, const HardwareProfile& hw,
                              const ExpertSweepOptions& o) {
  nlohmann::json j;
  j["hw"] = hw.name;
  j["memory_bandwidth"] = hw.memory_bandwidth;
  j["achievable_flops"] = hw.achievable_flops;
  j["gemm_table"] = !hw.gemm_table.empty();
  j["decode_batches"] = o.decode_batches;
  j["weight_bytes"] = o.serve.weight_bytes;
  j["cache_bytes"] = o.serve.cache_bytes;
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json x;
    x["family"] = r.family;
    x["experts"] = r.config.num_experts;
    x["width"] = r.config.moe_intermediate_size;
    x["top_k"] = r.top_k;
    x["original"] = r.is_original;
    x["total"] = r.total;
    x["active"] = r.active;
    x["train_step_s"] = r.train_step_s;
    x["train_memory_bytes"] = r.train_memory_bytes;
    x["serve_weight_bytes"] = r.serve_weight_bytes;
    nlohmann::json dec = nlohmann::json::array();
    for (const auto& s : r.decode)
      dec.push_back({{"batch", s.batch},
                     {"context", s.context},
                     {"step_s", s.step_s},
                     {"tokens_per_s", s.tokens_per_s()},
                     {"bytes", s.bytes()},
                     {"distinct_experts", s.distinct_experts}});
    x["decode"] = dec;
    arr.push_back(x);
  }
  j["rows"] = arr;
  return j.dump(2) + "\n";
}

}  // namespace zaya::sizing
