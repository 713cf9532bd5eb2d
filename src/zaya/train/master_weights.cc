#include "zaya/train/master_weights.h"

#include "zaya/core/error.h"
#include "zaya/ops/dense.h"

namespace zaya::train {

MasterWeights::MasterWeights(model::ZayaModel& model, optim::ShardRange range) : model_(model), range_(range) {
  const int64_t P = model_.grads_flat().numel();
  ZAYA_CHECK(model_.weight_dtype() == DType::f32, "MasterWeights: the model's weights must still be f32 (the "
             "masters are taken from them)");
  if (range_.end < 0) range_.end = P;
  ZAYA_CHECK(0 <= range_.begin && range_.begin <= range_.end && range_.end <= P, "MasterWeights: the range [",
             range_.begin, ", ", range_.end, ") is outside the ", P, " parameters");
  // A rank that owns every element keeps the model's f32 buffer itself as its masters: when the
  // model moves to bf16 storage that buffer stays, and no second f32 copy is ever allocated.
  if (range_.begin == 0 && range_.end == P)
    master_ = model_.params_flat();
  else
    master_ = Tensor::zeros(Shape{range_.end - range_.begin}, DType::f32, model_.device());
}

optim::ParamTable MasterWeights::table() const {
  optim::ParamTable t = optim::ParamTable::of(model_);
  t.params = master_;
  t.params_begin = range_.begin;
  return t;
}

void MasterWeights::adopt() {
  ZAYA_CHECK(model_.weight_dtype() == DType::f32, "MasterWeights::adopt: the model's weights are bf16 already");
  if (!master_.shares_storage_with(model_.params_flat()))
    master_.copy_from(model_.params_flat().window(range_.begin, Shape{range_.end - range_.begin}));
  model_.store_weights_bf16();
}

void MasterWeights::after_update() {
  if (range_.end > range_.begin)
    ops::cast_to_bf16(model_.params_flat().window(range_.begin, Shape{range_.end - range_.begin}), master_);
}

}  // namespace zaya::train
