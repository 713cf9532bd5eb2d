// Goodput under failures: the fraction of a run's wall time that advances training, given how
// often GPUs fail, how long a failure takes to detect and recover from, and the checkpoint
// interval and stall; and the interval that maximizes it (Young's first-order optimum
// sqrt(2·C/λ), and the numerical maximum of the model below). docs/aegis.md, "Goodput at scale".
//
// The model (first order in λ, as Young and Daly): failures arrive at rate λ = gpus × rate per
// wall second. Between checkpoints, τ seconds of training cost τ + C of wall time (C: the stall of
// one save). A failure wastes its detection time D, its recovery time R (kill, restart, load, the
// first step) and, on average, half an interval of wall time since the last checkpoint:
//
//   goodput(τ) = τ / (τ + C) × (1 − λ · (D + R + (τ + C) / 2))
#pragma once

#include <string>
#include <vector>

namespace zaya::sizing {

// Llama 3's published rate: 419 unexpected interruptions in 54 days on 16,384 GPUs.
constexpr double kLlama3FailuresPerGpuHour = 419.0 / (54.0 * 24.0 * 16384.0);

struct GoodputModel {
  int gpus = 1024;
  double failures_per_gpu_hour = kLlama3FailuresPerGpuHour;
  double ckpt_stall_s = 5;   // C: training stalled per checkpoint save
  double detect_s = 30;      // D
  double recover_s = 300;    // R: kill, restart, load the checkpoint, first step
  void validate() const;     // throws zaya::Error naming the bad field
  double failures_per_s() const { return gpus * failures_per_gpu_hour / 3600.0; }
  double mtbf_hours() const { return 1.0 / (gpus * failures_per_gpu_hour); }
};

// The model above at checkpoint interval `interval_s` (seconds of training between saves); 0 where
// failures come faster than the run can recover.
double goodput(const GoodputModel& m, double interval_s);
// Young's interval sqrt(2·C/λ), and the interval that maximizes goodput() (golden-section search).
double young_interval_s(const GoodputModel& m);
double best_interval_s(const GoodputModel& m);

// The table `zaya simulate --goodput` prints: goodput at a ladder of intervals, the two optima.
std::string format_goodput(const GoodputModel& m, const std::vector<double>& intervals_s);

}  // namespace zaya::sizing
