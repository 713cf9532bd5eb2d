// CPU kernels behind zaya/ops/optim_ops.h, with the same signatures as the fronts there (which
// check the arguments and call these for CPU tensors).
#pragma once

#include <span>

#include "zaya/ops/optim_ops.h"

namespace zaya::ops::cpu {

double global_grad_norm(std::span<const Tensor> grads);
void scale_inplace(const Tensor& t, float s);
void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad,
                  const AdamWHyper& hp, int64_t step);
// On all threads, or (on_this_thread) with all of the work on the calling one: Muon's
// side-by-side matrices run one matrix per thread.
void muon_momentum(const Tensor& grad, const Tensor& m, float beta, bool on_this_thread = false);
void muon_apply(const Tensor& param, const Tensor& update, float lr, float weight_decay, float scale,
                bool on_this_thread = false);

}  // namespace zaya::ops::cpu
