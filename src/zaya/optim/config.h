// OptimizerConfig: the [optim] section of a run config — learning-rate schedule, AdamW and Muon
// hyperparameters, clipping, and the expert-balance controller. docs/optim.md explains each rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zaya {
class ConfigReader;
}

namespace zaya::optim {

enum class ScheduleKind { wsd, cosine, constant };
enum class DecayShape { linear, one_minus_sqrt };

struct OptimizerConfig {
  // Learning rate: linear warmup over `warmup_steps` to `lr`, then the schedule, ending at `min_lr`
  // after `total_steps` optimizer steps.
  double lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 100;
  ScheduleKind schedule = ScheduleKind::wsd;
  double decay_fraction = 0.2;  // WSD: the last fraction of total_steps decays to min_lr
  DecayShape decay_shape = DecayShape::linear;
  int64_t total_steps = 1000;

  // AdamW (also the Muon group's decoupled weight decay).
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clip threshold; 0 disables clipping

  // Muon for 2-D hidden matrices (false = AdamW for everything: the one switch).
  bool muon = true;
  double muon_momentum = 0.95;
  int64_t muon_ns_steps = 5;
  bool muon_ns_bf16 = true;               // Newton–Schulz GEMMs on bf16 inputs (the reference's precision)
  int64_t muon_min_dim = 32;              // matrices with a side below this go to AdamW
  std::vector<std::string> muon_exclude;  // parameter-name substrings forced to AdamW

  // Expert-balance controller: its own AdamW on the balancing biases (no weight decay).
  bool balance_enabled = true;
  double balance_lr = 1e-3;
  double balance_beta1 = 0.9;  // the controller's AdamW betas (its own, not the model's)
  double balance_beta2 = 0.95;
  bool balance_follow_schedule = true;  // scale balance_lr by the model's lr / lr (warmup, decay)
  double balance_eps = 1e-2;  // its AdamW eps: above ~|p_e − 1/E| near balance, steps become proportional

  // Throws zaya::Error naming `source` and the offending key ("optim.<key>").
  void validate(const std::string& source) const;
  // Reads the [optim] section (every key optional; defaults above), then validates. Unknown keys
  // are left for the caller's ConfigReader::finish().
  static OptimizerConfig from_toml(ConfigReader& reader);
};

const char* schedule_name(ScheduleKind k);
const char* decay_shape_name(DecayShape s);

}  // namespace zaya::optim
