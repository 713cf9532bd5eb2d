// CPU kernels behind zaya/ops/dense.h, with the same signatures as the fronts there (which check
// the arguments and call these for CPU tensors), and the CPU-only store-mode choice of softmax.
#pragma once

#include "zaya/ops/dense.h"

namespace zaya::ops::cpu {

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b);
void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx);
// Reads the ids on the host and throws zaya::Error naming one outside [0, V).
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

// How softmax_forward writes y: plain stores, or streaming (non-temporal) stores that skip the
// write-allocate read. `automatic` (what ops::softmax_forward uses) streams only an output larger
// than the caches. The values are the same in every mode. Unchecked: x and y f32 of one shape on
// the CPU (benchmarks and tests call this form to compare the modes).
enum class StoreMode { automatic, cached, streaming };
void softmax_forward(const Tensor& y, const Tensor& x, StoreMode mode);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);

}  // namespace zaya::ops::cpu
