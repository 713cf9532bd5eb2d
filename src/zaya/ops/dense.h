// Dense (per-token) ops: linear, embedding, RMSNorm, residual scaling, activations, softmax.
//
// Conventions (all ops here): tokens are flattened to rows, activations are contiguous row-major
// [N, F] f32; outputs are preallocated by the caller; parameter gradients ACCUMULATE
// (dW += ...) so micro-batches can add up, activation gradients are WRITTEN (dx = ...). Optional
// tensors (a bias, a gradient nobody needs) are passed as an undefined Tensor{}. Every op is bitwise
// deterministic across runs and, on the CPU, thread counts: rows are split among threads, and
// reductions over rows (parameter gradients) are split by column, each column summed by one thread
// in row order.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// y[N, out] = x[N, in]·Wᵀ + b, W [out, in] (Hugging Face layout), b [out] or undefined.
// x and W are both f32 or both bf16 (bf16 copies for the bf16 GEMM path); y is f32.
void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b);
// dx = dy·W (written, or added to dx with accumulate_dx: a second path's gradient into the same
// input without a temporary; skipped if undefined), dW += dyᵀ·x, db += Σ_rows dy (each skipped if
// undefined). dy is f32. On the bf16 path `dy_bf16` ([N, out] bf16 workspace) receives dy rounded
// to bf16 for the two GEMMs; db still sums the f32 dy.
void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16 = {}, bool accumulate_dx = false);

// y[n] = E[ids[n]]; ids i32 of any shape with N elements, E [V, H] f32 or bf16, y [N, H] f32. A
// bf16 table (the model's bf16 weights) gives its rows widened to f32, which is exact: y is bitwise
// the f32 op on the widened table.
// An id outside [0, V) throws zaya::Error naming it and V on the CPU; a CUDA kernel cannot read the
// ids on the host, so there its row of y is NaN and the backward skips it (ops/cuda/dense_cuda.h).
void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& E);
// dE[v] += Σ_{n: ids[n] = v} dy[n], except rows with ids[n] == padding_idx (-1: none).
void embedding_backward(const Tensor& dE, const Tensor& dy, const Tensor& ids, int64_t padding_idx = -1);

// y = w ⊙ (x · rstd), rstd = 1/sqrt(mean(x²) + eps) per row (fp32), saved in rstd [N].
void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
// dx written (or added to dx with accumulate_dx), dw += Σ_rows dy ⊙ x·rstd.
void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, bool accumulate_dx = false);

// ZAYA1 residual scaling, four per-channel [F] vectors (HF names in comments):
// y = (h + hidden_bias) ⊙ hidden_scale + (x + residual_bias) ⊙ residual_scale.
struct ResidualScaleParams {
  Tensor hidden_scale;    // *.hidden_states_scale
  Tensor hidden_bias;     // *.hidden_states_bias
  Tensor residual_scale;  // *.residual_scale
  Tensor residual_bias;   // *.residual_bias
};
void residual_scale_forward(const Tensor& y, const Tensor& h, const Tensor& x, const ResidualScaleParams& p);
// dh, dx written (either may be undefined); the four parameter gradients in `grads` accumulate.
// h is f32, or bf16: the model's bf16 saved activations (ZayaModel::set_activation_dtype) keep only
// a bf16 copy of h, and only ds_h += Σ dy ⊙ (h + b_h) reads it. A bf16 h is read widened (exact),
// so the result is bitwise the f32 op on the widened h.
void residual_scale_backward(const Tensor& dh, const Tensor& dx, const ResidualScaleParams& grads, const Tensor& dy,
                             const Tensor& h, const Tensor& x, const ResidualScaleParams& p);

// Elementwise activations on any f32 shape. Backward writes dx and may run in place (dx == dy).
void silu_forward(const Tensor& y, const Tensor& x);  // x·σ(x)
void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void gelu_forward(const Tensor& y, const Tensor& x);  // exact: ½x(1 + erf(x/√2))
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

// SwiGLU on gu [N, 2I]: gate g = first I columns, value v = last I; y [N, I] = silu(g) ⊙ v.
void swiglu_forward(const Tensor& y, const Tensor& gu);
// dgu [N, 2I] f32 from dy [N, I] f32 and gu f32 or bf16 (the saved copy of bf16 activations): a bf16
// gu is widened exactly as it is read, so the result is bitwise the f32 op's on the widened gu.
void swiglu_backward(const Tensor& dgu, const Tensor& dy, const Tensor& gu);

// dst = src rounded to bf16 (round to nearest even), elementwise; src f32, dst bf16 with as many
// elements (any shapes). The operand copies of the bf16 GEMM paths (expert weights, Newton–Schulz iterates).
void cast_to_bf16(const Tensor& dst, const Tensor& src);
// dst = src widened to f32, elementwise and exact: each element's bits are src's followed by 16 zero
// bits (every bf16 value is an f32 value). src bf16, dst f32 with as many elements (any shapes).
// cast_to_bf16 of the result gives src back (a signalling NaN comes back quiet).
void cast_to_f32(const Tensor& dst, const Tensor& src);

// Row softmax in fp32 over the last dim; backward from the saved output y.
void softmax_forward(const Tensor& y, const Tensor& x);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);

}  // namespace zaya::ops
