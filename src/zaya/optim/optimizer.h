// Optimizer: the one object the trainer calls. It owns the AdamW and Muon state for a ZayaModel's
// parameters and the expert-balance controller for its balancing biases.
//
//   Optimizer opt(cfg, model);                     // logs the Muon/AdamW split and state bytes
//   ... forward/backward (accumulate grads) ...
//   StepStats s = opt.step(model, lr_at(cfg, opt.steps() + 1));   // clip, update, zero grads
//   opt.balance_step(model, counts);               // counts [L·E]: the step's global expert loads
//
// State layout (cheap to shard and checkpoint): the first moment is one flat f32 buffer aligned
// element for element with the model's parameter buffer — AdamW's m for AdamW parameters, Muon's
// momentum for Muon parameters — so a contiguous parameter range has a contiguous state range.
// AdamW's second moment exists only for the AdamW group, packed in parameter order.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/balancer.h"
#include "zaya/optim/config.h"
#include "zaya/optim/grouping.h"
#include "zaya/optim/muon.h"

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
  Optimizer(const OptimizerConfig& config, const model::ZayaModel& model);

  // Clip (when grad_clip > 0), update every parameter with learning rate `lr` (AdamW and Muon
  // share it: Muon's update is RMS-matched), then zero the gradients. A non-finite gradient norm
  // skips the update (state untouched, step counter not advanced) and still zeroes the gradients;
  // the trainer decides what a skipped step means (Aegis treats repeated ones as a NaN failure).
  StepStats step(model::ZayaModel& model, double lr);

  // Expert-balance controller step (no-op when balance_enabled is false).
  // `lr` is the model's learning rate of the step just taken; with optim.balance_follow_schedule
  // the controller's rate is balance_lr · lr / optim.lr (it warms up and decays with the model).
  void balance_step(model::ZayaModel& model, std::span<const int64_t> counts, double lr = -1);

  // Adds the last forward's per-layer routed-token counts (real experts, skip excluded) to
  // `counts` [L·E], resizing it on first use. Call after every micro-batch's forward; all-reduce
  // across data-parallel ranks before balance_step.
  static void accumulate_router_counts(const model::ZayaModel& model, std::vector<int64_t>& counts);

  // Every state tensor, named for checkpoints: "<param>.adam_m", "<param>.adam_v",
  // "<param>.muon_momentum", "<balancing_biases>.adam_m|adam_v", "optim.step", "optim.balance_step"
  // (the counters as i64 [1]). Views of the live state (the counters are refreshed by this call).
  std::vector<std::pair<std::string, Tensor>> state_tensors();
  // Copies every state tensor from `state` (names as above); names it does not own are ignored
  // (a checkpoint also holds the model). A missing name or a shape/dtype mismatch throws, naming it.
  void load_state(const std::map<std::string, Tensor>& state);

  int64_t steps() const { return step_; }
  const OptimizerConfig& config() const { return cfg_; }
  const GroupSummary& summary() const { return summary_; }
  const ParamGroup& group(int param_index) const { return groups_[param_index]; }
  size_t state_bytes() const;

 private:
  OptimizerConfig cfg_;
  std::vector<model::ParamSpec> specs_;
  std::vector<ParamGroup> groups_;
  std::vector<int64_t> offset_;    // element offset of each parameter in the flat buffers
  std::vector<int64_t> v_offset_;  // offset in adam_v_ (AdamW group), −1 for Muon parameters
  GroupSummary summary_;
  Tensor moment1_;  // [P] aligned with the parameters
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
  void muon_matrices_side_by_side(model::ZayaModel& model, MuonHyper mh, int threads);
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
