// CUDA kernels behind zaya/ops/dense.h (dense.cu), with the fronts' signatures; the fronts in
// ops/dense.cc check the arguments and call these for CUDA tensors. A plain C++ header (no CUDA
// types), included only where the build has CUDA (ZAYA_HAVE_CUDA).
//
// fp32 tensors, as the CPU kernels take them, except a bf16 embedding table (widened as it is read)
// and the casts between f32 and bf16.
// Every kernel runs on the calling thread's device context (core/cuda_context.h), never
// synchronizes with the host and reads no tensor memory on the host; without a GPU each throws a
// zaya::Error naming the op. Parameter gradients are summed without atomics, in orders fixed by
// the shapes: bitwise the same run to run.
#pragma once

#include "zaya/ops/dense.h"

namespace zaya::ops::cuda {

// An id outside [0, V) cannot throw from the device: its row of y is NaN (so the loss shows it) and
// the backward skips it.
void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& E);
void embedding_backward(const Tensor& dE, const Tensor& dy, const Tensor& ids, int64_t padding_idx);
void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, bool accumulate_dx);
void residual_scale_forward(const Tensor& y, const Tensor& h, const Tensor& x, const ResidualScaleParams& p);
void residual_scale_backward(const Tensor& dh, const Tensor& dx, const ResidualScaleParams& grads, const Tensor& dy,
                             const Tensor& h, const Tensor& x, const ResidualScaleParams& p);
void silu_forward(const Tensor& y, const Tensor& x);
void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void gelu_forward(const Tensor& y, const Tensor& x);
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(const Tensor& y, const Tensor& gu);
void swiglu_backward(const Tensor& dgu, const Tensor& dy, const Tensor& gu);
void cast_to_bf16(const Tensor& dst, const Tensor& src);
void cast_to_f32(const Tensor& dst, const Tensor& src);
void softmax_forward(const Tensor& y, const Tensor& x);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);

}  // namespace zaya::ops::cuda
