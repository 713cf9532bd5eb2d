// The parameter grouping rule: which optimizer updates each parameter (Muon or AdamW) and whether
// it gets weight decay. A pure function of the ParamSpec and the config, so every rank, the
// checkpoint writer and `zaya size` agree without talking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/model/params.h"
#include "zaya/optim/config.h"

namespace zaya::optim {

enum class Group { muon, adamw };

struct ParamGroup {
  Group group = Group::adamw;
  bool weight_decay = false;
  // For Muon: the 2-D matrices Newton–Schulz sees. A [E, r, c] expert stack is E separate
  // r×c matrices (count = E); a hidden matrix is one (count = 1).
  int64_t count = 1, rows = 0, cols = 0;
};

// Muon: 2-D hidden matrices and every expert's matrices, when both sides >= muon_min_dim and no
// muon_exclude substring occurs in the name (and config.muon is on). AdamW: everything else
// (embedding, norms, scales, biases, temperatures, conv kernels, small router matrices).
// Weight decay: matrices (either optimizer) and the embedding; never norms, scales, biases,
// temperatures or conv kernels (docs/optim.md says why).
ParamGroup group_of(const model::ParamSpec& spec, const OptimizerConfig& config);

struct GroupSummary {
  int64_t muon_tensors = 0, muon_matrices = 0, muon_params = 0;
  int64_t adamw_tensors = 0, adamw_params = 0;
  int64_t decay_params = 0, no_decay_params = 0;
  std::string str() const;  // one line for the log
};
GroupSummary summarize_groups(const std::vector<model::ParamSpec>& specs, const OptimizerConfig& config);

}  // namespace zaya::optim
