// What the trainer records of a step: the metrics.jsonl record (loss, learning rate, gradient
// norm, throughput, MFU, the step's time by part, expert loads) and the progress line's extras.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zaya/core/peak_flops.h"
#include "zaya/train/train_step.h"

namespace zaya::train {

// Expert loads of one step, per layer: entropy of the routed-token distribution normalized by ln E
// (1 = uniform), max/min load relative to uniform (1 = its fair share), and the skip fraction.
struct ExpertLoads {
  std::vector<double> entropy, max_load, min_load, skip_fraction;
  double min_entropy = 1;
};
ExpertLoads expert_loads(const std::vector<int64_t>& counts, const std::vector<int64_t>& skipped, int64_t layers,
                         int64_t experts);

// The step's record: `step` and `tokens` are the totals after it; `flops_per_token` gives the
// achieved TFLOP/s. With a peak (the run's, over every rank) the record carries the MFU and names
// the peak (`mfu_peak`, `mfu_peak_tflops`); without one it has no `mfu`.
nlohmann::json step_record(const StepResult& r, int64_t step, int64_t tokens, double flops_per_token,
                           const std::optional<PeakFlops>& peak, const ExpertLoads& loads);

}  // namespace zaya::train
