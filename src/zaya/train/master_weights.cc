#include "zaya/train/master_weights.h"

#include "zaya/core/error.h"
#include "zaya/ops/grad_wire.h"

namespace zaya::train {

MasterWeights::MasterWeights(const Tensor& params, optim::ShardRange range) : params_(params), range_(range) {
  ZAYA_CHECK(params_.dtype() == DType::f32 && params_.ndim() == 1, "MasterWeights: the parameters ",
             params_.str(), " must be one flat f32 buffer");
  if (range_.end < 0) range_.end = params_.numel();
  ZAYA_CHECK(0 <= range_.begin && range_.begin <= range_.end && range_.end <= params_.numel(),
             "MasterWeights: the range [", range_.begin, ", ", range_.end, ") is outside the ", params_.numel(),
             " parameters");
  master_ = Tensor::zeros(Shape{range_.end - range_.begin}, DType::f32, params_.device());
}

Tensor MasterWeights::owned() const { return params_.window(range_.begin, Shape{range_.end - range_.begin}); }

void MasterWeights::adopt() {
  master_.copy_from(owned());
  ops::round_to_bf16(params_);
}

void MasterWeights::before_update() { owned().copy_from(master_); }

void MasterWeights::after_update() {
  const Tensor mine = owned();
  master_.copy_from(mine);
  ops::round_to_bf16(mine);
}

}  // namespace zaya::train
