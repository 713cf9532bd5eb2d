// CUDA linear layers behind zaya/ops/dense.h's linear_forward and linear_backward (linear.cu), with
// the fronts' signatures; a plain C++ header, included only where the build has CUDA. The products
// go through the device-neutral ops::gemm front (cuBLASLt when it has its CUDA kernel); the bias,
// the bf16 copy of dy and db's column sums are kernels here. fp32 outputs; x and W f32 or bf16.
#pragma once

#include "zaya/core/tensor.h"

namespace zaya::ops::cuda {

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b);
void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx);

}  // namespace zaya::ops::cuda
