// Per-channel bias-then-scale: y = (x + b) ⊙ g, with b and g [F] broadcast over the rows of x
// [N, F]. ZAYA1 applies it to the embedding output (model.input_hidden_states_bias, then
// model.input_hidden_states_scale; no √H factor).
#pragma once

#include "zaya/core/tensor.h"

namespace zaya::ops {

void scale_bias_forward(const Tensor& y, const Tensor& x, const Tensor& b, const Tensor& g);
// dx = dy ⊙ g (written), db += Σ_rows dy ⊙ g, dg += Σ_rows dy ⊙ (x + b).
void scale_bias_backward(const Tensor& dx, const Tensor& db, const Tensor& dg, const Tensor& dy, const Tensor& x,
                         const Tensor& b, const Tensor& g);

}  // namespace zaya::ops
