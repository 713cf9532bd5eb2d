// `zaya size --sweep-experts`: the MoE-width trade-off of one model. Three families of expert
// shapes around the config's E experts of width I (top-1):
//   fine-grained  E·g experts of I/g, top-g (g = 1, 2, 4, 8): fixed active AND total parameters;
//                 narrower expert GEMMs, more distinct experts read per decode step.
//   count         E' experts of I, top-1 (E' = E/4, E/2, 2E, 4E): fixed active parameters, the total
//                 (and the serving memory) grows with E'.
//   coarse        E/2 of 2I and E/4 of 4I, top-1: fixed total parameters; fewer, wider experts cost
//                 more active parameters (top-1 cannot be wider at fixed active: active = one expert).
// Each row: training step time (size_model's model, top-k expert rows), decode latency at the
// given batches (decode_roofline), training memory per rank and the serving weights.
#pragma once

#include <string>
#include <vector>

#include "zaya/sizing/decode_roofline.h"
#include "zaya/sizing/size_report.h"

namespace zaya::sizing {

struct ExpertSweepOptions {
  std::vector<int64_t> decode_batches{1, 64};
  int64_t context = 0;  // decode positions per sequence (0: the run's seq)
  ServeOptions serve;   // its top_k is set per row
};

struct ExpertSweepRow {
  std::string family;  // "fine-grained", "count", "coarse"
  model::ModelConfig config;
  int64_t top_k = 1;
  bool is_original = false;
  int64_t total = 0, active = 0;  // parameters (active: non-embedding, k experts per layer)
  double train_step_s = 0, train_compute_s = 0, train_memory_bytes = 0;
  std::vector<DecodeStep> decode;  // one per decode batch
  double serve_weight_bytes = 0;   // every parameter at the serving weight bytes
};

// Training compute seconds of one step with `top_k` experts per token: FLOPs 6 · tokens ·
// decode_params_per_token(c, k) + attention at the profile's achievable rate, or GEMM by GEMM from
// its table (model_gemms with tokens·k/E rows per expert). Equals size_model's compute_time_s at k 1.
double training_compute_seconds(const model::ModelConfig& c, const RunShape& run, const HardwareProfile& hw, int64_t top_k);

std::vector<ExpertSweepRow> sweep_experts(const model::ModelConfig& c, const RunShape& run, const HardwareProfile& hw,
                                          const ExpertSweepOptions& o);
std::string format_expert_sweep(const std::vector<ExpertSweepRow>& rows, const HardwareProfile& hw,
                                const ExpertSweepOptions& o);
// The rows as JSON (tools/plot_expert_sweep.py reads it).
std::string expert_sweep_json(const std::vector<ExpertSweepRow>& rows, const HardwareProfile& hw,
                              const ExpertSweepOptions& o);

}  // namespace zaya::sizing
