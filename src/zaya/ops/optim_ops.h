// Optimizer primitives: global gradient norm and clipping, the AdamW update, and the Newton–Schulz
// quintic iteration that Muon uses to orthogonalize an update. f32 CPU tensors; in place.
#pragma once

#include <cstdint>
#include <span>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// sqrt(Σ over every tensor and element of g²), accumulated in double. Each tensor is cut into
// fixed 16 Ki-element blocks summed in parallel, and the block sums are added in order, so the
// result is bitwise the same for any thread count.
double global_grad_norm(std::span<const Tensor> grads);

// Multiplies every gradient by min(1, max_norm / (norm + 1e-6)) (PyTorch's clip_grad_norm_ rule)
// and returns the norm measured before clipping.
double clip_grad_norm(std::span<const Tensor> grads, double max_norm);

// t ← s·t.
void scale_inplace(const Tensor& t, float s);

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One AdamW step t >= 1 (decoupled weight decay, bias-corrected moments):
//   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  m̂ = m/(1−β1^t);  v̂ = v/(1−β2^t)
//   p ← p − lr·(m̂/(√v̂ + eps) + wd·p)
void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& hp,
                  int64_t step);

// Muon's quintic coefficients (Keller Jordan's): they push every singular value of a matrix with
// ‖X‖₂ <= 1 into roughly [0.7, 1.2] in five steps instead of converging to exactly 1.
constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f, kNewtonSchulzC = 2.0315f;

// One step for X [r, c] with r <= c: A = X·Xᵀ, B = b·A + c·A·A, X_next = a·X + B·X.
// A and B are [r, r] workspaces; X_next must not overlap X.
void newton_schulz_step(const Tensor& X, const Tensor& X_next, const Tensor& A, const Tensor& B,
                        float a = kNewtonSchulzA, float b = kNewtonSchulzB, float c = kNewtonSchulzC);

// f32 elements newton_schulz_orthogonalize needs for a [rows, cols] matrix: 2·r·c + 2·r² with
// r = min(rows, cols), c = max(rows, cols).
int64_t newton_schulz_workspace_elems(int64_t rows, int64_t cols);

// out ≈ U·Vᵀ for G = U·S·Vᵀ: X₀ = G/(‖G‖_F + 1e-7) (transposed when rows > cols so the Gram
// matrix is the small side), `steps` quintic steps, transposed back. G and out are [rows, cols].
void newton_schulz_orthogonalize(const Tensor& G, const Tensor& out, const Tensor& workspace, int steps = 5);

}  // namespace zaya::ops
