// Learning-rate schedules, the global batch-size ramp, and the multi-phase training recipe.
// All are pure functions of counters the trainer keeps (optimizer steps, consumed tokens), so a
// resumed run recomputes them exactly from its checkpointed counters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/optim/config.h"

namespace zaya {
class ConfigReader;
}

namespace zaya::optim {

// Learning rate of optimizer step `step` (1-based: the first update is step 1).
//   warmup (step <= W):  lr · step / W
//   wsd:      lr until decay_start = total − round(decay_fraction·total), then over the decay steps
//             with progress x ∈ (0, 1]: min + (lr − min)·(1 − x)  (linear)  or  ·(1 − √x)  (1-sqrt)
//   cosine:   min + (lr − min)·½(1 + cos(π·x)), x = (step − W)/(total − W)
//   constant: lr
// Steps past total_steps get min_lr (wsd, cosine) or lr (constant).
double lr_at(const OptimizerConfig& c, int64_t step);

// Global batch size ramp: from `start` sequences up to `full` linearly over the first `tokens`
// consumed tokens, always a multiple of `micro` (the micro-batch times the data-parallel size), so
// gradient accumulation divides it evenly. start == full (or tokens == 0) disables the ramp.
struct BatchRamp {
  int64_t start = 0;
  int64_t full = 0;
  int64_t tokens = 0;
  int64_t micro = 1;
  void validate(const std::string& source) const;
  // Sequences in the global batch once `consumed` tokens have been trained on.
  int64_t batch_at(int64_t consumed) const;
};

// One phase of a recipe ([[recipe.phases]] in the run config).
struct Phase {
  std::string name;
  int64_t tokens = 0;  // tokens trained in this phase
  int64_t seq_len = 4096;
  double rope_theta = 0;             // RoPE base; 0 (the key absent): the model's rope_theta
  std::vector<double> data_weights;  // blend weights, one per dataset of the run's data list
                                     // (empty: the run's [data] weights)
  int64_t batch_size = 0;            // global batch in sequences
};

// One optimizer step of a recipe: its phase and its batch of `batch_size` sequences of `seq_len`.
struct RecipeStep {
  int phase = 0;
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  int64_t tokens() const { return batch_size * seq_len; }
};

// ZAYA1's recipe is three phases: 4k web-heavy pretraining, 4k code/math-heavy, then context
// extension to 32k with a larger RoPE θ (DESIGN.md "Optimizers and recipe").
struct Recipe {
  std::vector<Phase> phases;
  // Optional batch ramp at the start of training ([recipe] batch_ramp_start, batch_ramp_tokens);
  // the full batch is the first phase's batch_size.
  int64_t batch_ramp_start = 0;
  int64_t batch_ramp_tokens = 0;

  int64_t total_tokens() const;
  // Index of the phase that the next token belongs to after `consumed` tokens: phase i covers
  // [Σ_{j<i} tokens_j, Σ_{j<=i} tokens_j). Past the end: the last phase (the run is done).
  int phase_at(int64_t consumed) const;
  // Tokens consumed when phase i starts.
  int64_t phase_start(int i) const;
  BatchRamp batch_ramp(int64_t micro) const;
  // The step that starts once `consumed` tokens are trained on. A step never straddles phases: it
  // belongs wholly to phase_at(consumed), so a phase's last step may run past the phase's end (the
  // next phase then starts that much later, its own end unchanged). The batch is the phase's
  // batch_size, or in phase 0 the ramp's batch_at(consumed) (the ramp lies within phase 0).
  // `micro` is the ramp granularity (micro-batch times data-parallel size).
  RecipeStep step_at(int64_t consumed, int64_t micro) const;
  // Optimizer steps until total_tokens() are consumed (a pure function of the recipe).
  int64_t num_steps(int64_t micro) const;

  void validate(const std::string& source) const;
  // Reads [recipe] and every [[recipe.phases]] element (name, tokens, seq_len, rope_theta,
  // data_weights, batch_size; tokens, seq_len and batch_size required). No phases: an empty recipe.
  static Recipe from_toml(ConfigReader& reader);
};

}  // namespace zaya::optim
