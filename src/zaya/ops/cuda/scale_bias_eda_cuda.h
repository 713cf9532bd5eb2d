// CUDA kernels behind zaya/ops/scale_bias.h and zaya/ops/router_state.h (scale_bias.cu,
// router_state.cu), with the fronts' signatures; a plain C++ header, included only where the build
// has CUDA. fp32; the parameter gradients' column sums are deterministic (no atomics).
#pragma once

#include "zaya/core/tensor.h"

namespace zaya::ops::cuda {

void scale_bias_forward(const Tensor& y, const Tensor& x, const Tensor& b, const Tensor& g);
void scale_bias_backward(const Tensor& dx, const Tensor& db, const Tensor& dg, const Tensor& dy, const Tensor& x,
                         const Tensor& b, const Tensor& g);

void eda_forward(const Tensor& r, const Tensor& r_prev, const Tensor& s);
// r_prev, s and ds all undefined for a layer without EDA.
void eda_backward(const Tensor& dr, const Tensor& carried, const Tensor& ds, const Tensor& r_prev,
                  const Tensor& s);

}  // namespace zaya::ops::cuda
