// CUDA kernels behind zaya/ops/optim_ops.h (optim_ops.cu) and newton_schulz.h (newton_schulz.cu),
// with the fronts' signatures; the fronts check the arguments and call these for CUDA tensors. A
// plain C++ header (no CUDA types), included only where the build has CUDA (ZAYA_HAVE_CUDA).
//
// AdamW and the scaling are bitwise the CPU's (the same IEEE operations per element: optim_math.h);
// so is the gradient norm (the CPU's block and lane order, in double). Newton–Schulz runs its GEMMs
// through cuBLASLt in the CPU's precision (bf16 inputs with f32 accumulation, or f32), in another
// summation order.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "zaya/ops/newton_schulz.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::ops::cuda {

// The one host synchronization of the optimizer's step: the norm comes back to the host (the
// clipping decision needs it).
double global_grad_norm(std::span<const Tensor> grads);
void scale_inplace(const Tensor& t, float s);
void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad, const AdamWHyper& hp,
                  int64_t step);
void muon_momentum(const Tensor& grad, const Tensor& m, float beta);
void muon_apply(const Tensor& param, const Tensor& update, float lr, float weight_decay, float scale);

// Σ x² in double of `count` consecutive matrices of n floats each at `base` (device memory), in
// global_grad_norm's order, into sums[0..count) (device memory). `scratch` holds at least
// uniform_sum_squares_scratch_bytes(n, count) bytes of device memory. Queued on the stream.
size_t uniform_sum_squares_scratch_bytes(int64_t n, int64_t count);
void uniform_sum_squares(std::string_view op, const float* base, int64_t n, int64_t count, double* sums,
                         void* scratch);

void newton_schulz_step(const Tensor& X_next, const Tensor& X, const Tensor& A, const Tensor& B, float a, float b,
                        float c);
// No host synchronization: the per-matrix norms, the linear-path decision and the scaling stay on
// the device (the CPU reads the norms on the host and skips the iteration when every matrix takes
// the linear path; here the iteration then runs on zeros, which gives the same zeros).
void newton_schulz_orthogonalize(const Tensor& out, const Tensor& G, const Tensor& workspace, int steps,
                                 DType compute);

}  // namespace zaya::ops::cuda
