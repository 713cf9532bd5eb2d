// Mixed-precision weights (train.param_dtype = "bf16", docs/train.md "Precision"): the model
// stores and computes with bf16 weights while the optimizer updates fp32 master weights, the split
// ZAYA1 was trained with. Under ZeRO-1 the master weights are sharded like the optimizer state:
// each rank keeps the fp32 values of its own range only, so a rank holds 2 bytes of weights per
// parameter plus 4 / (data-parallel ranks) of masters.
//
//   (construction)    a rank that owns every element takes the model's f32 buffer as its masters
//   adopt()           master ← the model's f32 weights of the owned range; the model then stores
//                     its weights in bf16 (ZayaModel::store_weights_bf16) and frees the f32 ones
//   optimizer.step    updates the masters in place (its ParamTable's params are master(), from
//                     flat element range().begin: table())
//   after_update()    weights[owned] ← bf16(master); the parameter all-gather sends them on
//
// A skipped update leaves both unchanged. Checkpoints store the master values under the
// parameters' names (model_io weight_items): a resume continues bitwise, and a checkpoint loads
// the same way whatever the precision of the run reading it.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/param_table.h"

namespace zaya::train {

class MasterWeights {
 public:
  // `model`: f32 weights and bf16 GEMMs until adopt(); `range`: the elements this rank owns.
  MasterWeights(model::ZayaModel& model, optim::ShardRange range);

  // After the model's weights were set (init, a checkpoint, a start point) with the same
  // full-precision values on every rank: the owned range becomes the master copy and the model's
  // weights become bf16 (every rank rounds the same values, so no exchange is needed).
  void adopt();
  void after_update();

  // The optimizer's table: the model's (names, offsets, gradients, balancing biases) with the
  // masters as the values it updates.
  optim::ParamTable table() const;
  // The fp32 values of the owned range [begin, end), aligned with it: what a checkpoint stores.
  const Tensor& master() const { return master_; }
  const optim::ShardRange& range() const { return range_; }
  int64_t bytes() const { return static_cast<int64_t>(master_.nbytes()); }

 private:
  model::ZayaModel& model_;
  Tensor master_;
  optim::ShardRange range_;
};

}  // namespace zaya::train
