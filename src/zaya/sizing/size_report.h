// `zaya size`: what a model costs on given hardware: parameters, FLOPs per token, memory per rank,
// predicted step time and MFU, and the sizing-rule checks of the ZAYA1 paper.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zaya/model/config.h"
#include "zaya/sizing/hardware.h"

namespace zaya::sizing {

struct RunShape {
  int64_t dp = 1;    // data-parallel ranks
  int64_t mbs = 1;   // micro-batch (sequences per rank per step)
  int64_t seq = 4096;
  int zero = 1;      // ZeRO stage: 0 (replicated optimizer) or 1 (sharded)
  // Activation recomputation (train.recompute): each layer keeps its input, router state and
  // routing choice; one layer's saved activations are shared; L − 1 layer forwards more per step.
  bool recompute = false;
};

struct MemoryPerRank {
  double weights = 0, gradients = 0, optimizer = 0, activations = 0;  // bytes
  double total() const { return weights + gradients + optimizer + activations; }
};

struct RuleCheck {
  std::string rule;
  bool ok = false;
  std::string reason;
  // Shape rules (multiples of 64, head dim) must hold for a --suggest candidate; advisory rules
  // (expert GEMM size, which depends on the run) are reported and priced into the step time.
  bool hard = true;
};

struct SizeReport {
  model::ModelConfig config;
  RunShape run;
  int64_t total = 0, embedding = 0, non_embedding = 0, active = 0;
  double flops_per_token = 0;
  int64_t kv_cache_bytes_per_token = 0;  // bf16
  MemoryPerRank memory;
  std::vector<RuleCheck> rules;
  std::optional<HardwareProfile> hw;
  double step_time_s = 0, compute_time_s = 0, comm_time_s = 0, mfu = 0;
  // FLOPs per token the recomputed layer forwards add (0 without recompute): not model FLOPs, so
  // they lengthen the step and lower the MFU.
  double recompute_flops_per_token = 0;
};

SizeReport size_model(const model::ModelConfig& c, const RunShape& run, const std::optional<HardwareProfile>& hw);
std::string format_size_report(const SizeReport& r);
// A measured step of the report's shape (`zaya bench step`'s step time, one rank's micro-batch of
// run.mbs × run.seq tokens) next to the profile's prediction: both times, their ratio and both
// MFUs, so a profile can be checked against the kernels it stands for. Needs r.hw (a zaya::Error
// says so) and a positive time.
std::string format_measured_step(const SizeReport& r, double measured_step_s);

}  // namespace zaya::sizing
