#include "zaya/optim/grouping.h"

#include "zaya/core/error.h"

namespace zaya::optim {

using model::ParamRole;

ParamGroup group_of(const model::ParamSpec& s, const OptimizerConfig& c) {
  ParamGroup g;
  const bool is_matrix = s.role == ParamRole::matrix || s.role == ParamRole::expert_matrix;
  // Decay what has a scale freedom the loss does not pin down (matrices, embedding rows); leave
  // gains, biases, temperatures and the tiny conv kernels alone: shrinking a norm gain or a key
  // temperature toward 0 changes the function the model computes, not just its parameterization.
  g.weight_decay = is_matrix || s.role == ParamRole::embedding;
  if (!is_matrix || !c.muon) return g;
  if (s.role == ParamRole::matrix) {
    ZAYA_ASSERT(s.shape.ndim() == 2, "matrix ", s.name, " is not 2-D");
    g.count = 1, g.rows = s.shape[0], g.cols = s.shape[1];
  } else {
    ZAYA_ASSERT(s.shape.ndim() == 3, "expert matrix ", s.name, " is not [E, r, c]");
    g.count = s.shape[0], g.rows = s.shape[1], g.cols = s.shape[2];
  }
  bool small = g.rows < c.muon_min_dim || g.cols < c.muon_min_dim;
  bool excluded = false;
  for (const std::string& sub : c.muon_exclude) excluded = excluded || s.name.find(sub) != std::string::npos;
  if (small || excluded) {
    g.count = 1, g.rows = 0, g.cols = 0;
    return g;
  }
  g.group = Group::muon;
  return g;
}

GroupSummary summarize_groups(const std::vector<model::ParamSpec>& specs, const OptimizerConfig& c) {
  GroupSummary s;
  for (const model::ParamSpec& p : specs) {
    ParamGroup g = group_of(p, c);
    int64_t n = p.shape.numel();
    if (g.group == Group::muon) {
      s.muon_tensors += 1, s.muon_matrices += g.count, s.muon_params += n;
    } else {
      s.adamw_tensors += 1, s.adamw_params += n;
    }
    (g.weight_decay ? s.decay_params : s.no_decay_params) += n;
  }
  return s;
}

std::string GroupSummary::str() const {
  return zaya::str("optimizer groups: muon ", muon_tensors, " tensors (", muon_matrices, " matrices, ",
                   muon_params, " params); adamw ", adamw_tensors, " tensors (", adamw_params,
                   " params); weight decay on ", decay_params, " params, off on ", no_decay_params);
}

}  // namespace zaya::optim
