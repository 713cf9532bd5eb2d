// CUDA kernels behind zaya/ops/moe_skip.h (moe_skip.cu), with the fronts' arguments; the fronts in
// ops/moe_skip.cc check them and call these for CUDA tensors. A plain C++ header (no CUDA types),
// included only where the build has CUDA (ZAYA_HAVE_CUDA). fp32 activations, i32 choices.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops::cuda {

void moe_skip_forward(const Tensor& out, const Tensor& x, const Tensor& probs, const Tensor& choice, int64_t N,
                      int64_t E, int64_t H);
void moe_skip_input_backward(const Tensor& dx, const Tensor& dout, const Tensor& probs, const Tensor& choice,
                             int64_t N, int64_t E, int64_t H);
void moe_skip_router_backward(const Tensor& dlogits, const Tensor& dout, const Tensor& x, const Tensor& probs,
                              const Tensor& choice, int64_t N, int64_t E, int64_t H);

}  // namespace zaya::ops::cuda
