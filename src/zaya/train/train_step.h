// One optimizer step of training, the part of the loop that a world size changes (torchtitan's
// train_step): micro-batches of this rank's samples, forward and backward accumulating gradients,
// the gradient-sync point, the checkpoint fence, clipping and the update, the expert balancer. The
// trainer around it decides what to do with the result (metrics, evaluation, checkpoints).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/data/loader.h"
#include "zaya/dist/communicator.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/optimizer.h"
#include "zaya/train/batch.h"
#include "zaya/train/grad_sync.h"
#include "zaya/train/master_weights.h"

namespace zaya::train {

struct StepTimes {
  double data = 0, forward = 0, backward = 0, optimizer = 0, checkpoint_fence = 0, step = 0;  // seconds
  SyncTimes sync;  // the data-parallel reductions (zero without a GradientSync)
};

struct StepResult {
  double loss = 0;                     // mean training loss over the step's micro-batches
  optim::StepStats update;             // the optimizer's step (norm, clipping, skipped)
  int64_t sequences = 0;               // sequences in the step, over every rank
  int64_t tokens = 0;                  // tokens in the step, over every rank
  std::vector<int64_t> expert_counts;  // [L·E] tokens each real expert got, over every rank
  std::vector<int64_t> skipped;        // [L] tokens that chose the skip class, over every rank
  StepTimes time;
};

class TrainStep {
 public:
  // `comm` is the world of dp × cp ranks (cp fastest: rank = dp_rank · cp + cp_rank, as
  // dist::Mesh lays them out), over which the gradients are reduced; with cp > 1 the model must be
  // context parallel over the cp ranks of its dp group. `sync` (required when comm has more than
  // one rank) reduces the gradients and gathers the updated parameters; without it the step's
  // gradients are this rank's alone. `master` (train.param_dtype = "bf16"): the fp32 master weights
  // of this rank's range, which `optimizer` updates; the bf16 weights are rounded from them after it. `prefetch_gather`: the parameter all-gather
  // after the update is left running for the next forward to wait on (the model's ParamNeedFn must
  // then call sync->need_params); otherwise the step waits for it.
  TrainStep(model::ZayaModel& model, optim::Optimizer& optimizer, dist::Communicator& comm,
            GradientSync* sync = nullptr, int cp = 1, MasterWeights* master = nullptr, bool prefetch_gather = false);

  // `micro_batches` micro-batches from `data` (rows for this rank; the step's global batch is
  // micro_batches × the model's batch × comm.size()), then the update with learning
  // rate `lr`. `fence` runs just before the update and returns the seconds it waited (a deferred
  // checkpoint snapshot must finish copying the weights first).
  StepResult run(data::DataLoader& data, int64_t micro_batches, double lr, const std::function<double()>& fence);

 private:
  void shape_batch();  // (re)allocates the batch tensors for the model's current [B, T]

  model::ZayaModel& model_;
  optim::Optimizer& optimizer_;
  dist::Communicator& comm_;
  GradientSync* sync_;
  int cp_ = 1;
  MasterWeights* master_;
  bool prefetch_gather_;
  BatchBuffers batch_;  // the loader's whole sequences; this cp rank's part on the model's device
};

}  // namespace zaya::train
