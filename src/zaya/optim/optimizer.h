// Optimizer: the one object the trainer calls. It owns the AdamW and Muon state for the parameters
// of a ParamTable (the model's flat buffers and names; never the model object) and the
// expert-balance controller for its balancing biases.
//
//   Optimizer opt(cfg, ParamTable::of(model));     // logs the Muon/AdamW split and state bytes
//   ... forward/backward (accumulate grads) ...
//   StepStats s = opt.step(lr_at(cfg, opt.steps() + 1));   // clip, update, zero grads
//   opt.balance_step(counts);                      // counts [L·E]: the step's global expert loads
//
// State layout (cheap to shard and checkpoint): the first moment is one flat f32 buffer aligned
// element for element with the owned range of the parameter buffer — AdamW's m for AdamW
// parameters, Muon's momentum for Muon parameters — so a contiguous parameter range has a
// contiguous state range. AdamW's second moment exists only for the AdamW group's elements, packed
// in parameter order.
//
// Sharding (the interface ZeRO-1 uses): an optimizer may own the state of a sub-range
// [begin, end) of the flat buffers only (ShardRange); it then updates only the parameters' elements
// in that range. AdamW works element by element, so its parameters may be cut anywhere; a Muon
// matrix needs all of itself (Newton–Schulz orthogonalizes the whole matrix), so a range must hold
// each Muon matrix wholly or not at all. With one rank the range is everything.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/optim/balancer.h"
#include "zaya/optim/config.h"
#include "zaya/optim/grouping.h"
#include "zaya/optim/muon.h"
#include "zaya/optim/param_table.h"

namespace zaya::optim {

struct StepStats {
  int64_t step = 0;  // optimizer steps taken so far (this one included unless skipped)
  double lr = 0;
  double grad_norm = 0;  // global L2 norm of all gradients before clipping
  bool clipped = false;
  bool skipped = false;  // non-finite gradient norm: no parameter was touched
};

class Optimizer {
 public:
  // The table's buffers stay the caller's; the optimizer keeps views of them. `range` selects the
  // elements whose state this optimizer owns (see above); a range that cuts a Muon matrix throws,
  // naming it.
  Optimizer(const OptimizerConfig& config, const ParamTable& table, ShardRange range = {});

  // Sums a value over the ranks that share the model (the shards' squared gradient norms, so that
  // clipping uses the global norm). Unset: this optimizer's range is the whole gradient.
  using SumAcrossRanks = std::function<double(double)>;
  void set_sum_across_ranks(SumAcrossRanks f) { sum_across_ranks_ = std::move(f); }

  // Clip (when grad_clip > 0), update every owned parameter element with learning rate `lr` (AdamW
  // and Muon share it: Muon's update is RMS-matched), then zero the whole gradient buffer. A
  // non-finite gradient norm skips the update (state untouched, step counter not advanced) and
  // still zeroes the gradients; the trainer decides what a skipped step means (Aegis treats
  // repeated ones as a NaN failure).
  StepStats step(double lr);

  // Expert-balance controller step on the table's balancing biases (no-op when balance_enabled is
  // false). `lr` is the model's learning rate of the step just taken; with
  // optim.balance_follow_schedule the controller's rate is balance_lr · lr / optim.lr (it warms up
  // and decays with the model).
  void balance_step(std::span<const int64_t> counts, double lr = -1);

  // Every state tensor, named for checkpoints: "<param>.adam_m", "<param>.adam_v",
  // "<param>.muon_momentum", "<balancing_biases>.adam_m|adam_v", "optim.step", "optim.balance_step"
  // (the counters as i64 [1]). Views of the live state (the counters are refreshed by this call).
  std::vector<std::pair<std::string, Tensor>> state_tensors();
  // Copies every state tensor from `state` (names as above); names it does not own are ignored
  // (a checkpoint also holds the model). A missing name or a shape/dtype mismatch throws, naming it.
  void load_state(const std::map<std::string, Tensor>& state);

  // This optimizer's part of every state tensor (names as above), for sharded checkpoints: views of
  // the live state with the whole tensor's shape and where the part starts in it. A part of a
  // parameter cut by the shard range is whole rows of its leading dimension (the shard plan cuts
  // only there; another cut throws). `replicated` parts (the counters, the balancer's moments) are
  // the same on every rank: one rank saves them.
  struct StatePart {
    std::string name;
    Tensor tensor;
    std::vector<int64_t> global_shape, offsets;
    bool replicated = false;
  };
  std::vector<StatePart> state_parts();
  // After the caller filled every part's tensor in place (from a checkpoint): adopt the counters.
  void state_parts_loaded();

  int64_t steps() const { return step_; }
  const OptimizerConfig& config() const { return cfg_; }
  const GroupSummary& summary() const { return summary_; }
  const ParamGroup& group(int param_index) const { return groups_[param_index]; }
  const ShardRange& range() const { return range_; }
  size_t state_bytes() const;
  // Where the parameters, gradients and this optimizer's state live.
  Device device() const { return table_.params.device(); }

 private:
  // Parameter i's elements in the owned range: [first, last) offsets within the parameter, and
  // whether that is all of it.
  struct Owned {
    int64_t first = 0, last = 0;
    bool whole = false;
    bool any() const { return last > first; }
  };
  Owned owned(size_t i) const;
  Tensor moment1(size_t i, const Owned& o) const;  // the first moment of parameter i's owned elements

  OptimizerConfig cfg_;
  ParamTable table_;
  ShardRange range_;
  SumAcrossRanks sum_across_ranks_;
  std::vector<ParamGroup> groups_;
  std::vector<int64_t> v_offset_;  // offset in adam_v_ of the first owned element (AdamW), −1 for Muon
  GroupSummary summary_;
  Tensor moment1_;  // [end − begin] aligned with the owned range of the parameters
  Tensor adam_v_;   // [P_adamw]
  // Muon's matrices side by side (one per thread) when there are at least as many as threads;
  // else one all-thread call per parameter.
  struct MuonItem {
    int param;       // parameter index
    int64_t matrix;  // matrix of an [E, r, c] stack (0 for a 2-D parameter)
    double flops;    // Newton–Schulz FLOPs per step: the largest-first order
  };
  bool muon_side_by_side(int threads) const;
  int64_t muon_scratch_need(int threads) const;  // f32 elements of scratch_ the step needs on `threads`
  void muon_matrices_side_by_side(MuonHyper mh, int threads);
  std::vector<MuonItem> muon_items_;  // largest first
  int64_t per_matrix_scratch_ = 0;    // muon_scratch_elems of the largest single matrix
  int64_t stack_scratch_ = 0;         // ... and of the largest parameter (an expert stack whole)
  Tensor scratch_;  // Muon: per-thread windows of per_matrix_scratch_ (side by side), else the largest
                    // stack's orthogonalized updates + Newton–Schulz workspace
  Tensor step_t_, balance_step_t_;  // i64 [1] mirrors of the counters for checkpoints
  int64_t step_ = 0;
  BalanceController balancer_;
};

}  // namespace zaya::optim
