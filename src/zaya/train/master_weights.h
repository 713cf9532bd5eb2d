// Mixed-precision weights (train.param_dtype = "bf16", docs/train.md "Precision"): the model
// computes with bf16 weights while the optimizer updates fp32 master weights, the split ZAYA1 was
// trained with. Under ZeRO-1 the master weights are sharded like the optimizer state: each rank
// keeps the fp32 values of its own range only.
//
// The model's flat f32 buffer holds the bf16 weights (f32 storage of bf16 values: every op reads
// them as it reads f32 weights, and a bf16 copy of them is exact, so they cross the wire in bf16
// without loss). Around each update the owned range is swapped:
//
//   before_update()   params[owned] ← master          (the optimizer sees the fp32 values)
//   optimizer.step    updates params[owned] in place, as without master weights
//   after_update()    master ← params[owned]; params[owned] ← bf16(master)
//
// so the optimizer needs no second code path, and a skipped update leaves both copies unchanged.
// Checkpoints store the master values under the parameters' names (checkpoint_values()): a resume
// continues bitwise, and a checkpoint loads the same way whatever the precision of the run reading it.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"
#include "zaya/optim/param_table.h"

namespace zaya::train {

class MasterWeights {
 public:
  // `params`: the model's flat f32 buffer (kept as a view); `range`: the elements this rank owns.
  MasterWeights(const Tensor& params, optim::ShardRange range);

  // After the model's weights were set from outside (init, a checkpoint, a start point), with the
  // same full-precision values on every rank: the owned range becomes the master copy and the whole
  // buffer is rounded to bf16 (every rank rounds the same values, so no exchange is needed).
  void adopt();
  void before_update();
  void after_update();

  // The fp32 values of the owned range [begin, end), aligned with it: what a checkpoint stores.
  const Tensor& master() const { return master_; }
  const optim::ShardRange& range() const { return range_; }
  int64_t bytes() const { return static_cast<int64_t>(master_.nbytes()); }

 private:
  Tensor owned() const;  // params[begin, end)
  Tensor params_, master_;
  optim::ShardRange range_;
};

}  // namespace zaya::train
