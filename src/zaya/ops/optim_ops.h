// Optimizer primitives: global gradient norm and clipping and the AdamW update (Muon's
// Newton–Schulz iteration is in newton_schulz.h). f32 tensors; in place.
#pragma once

#include <math.h>

#include <cfloat>
#include <cmath>
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

// x, or 0 where |x| is below float's normal range (NaN kept): optimizer state that would decay
// into subnormals is stored as 0 instead (x86 runs arithmetic on subnormals through microcode
// assists, ~20× slower; docs/results/ops-cpu.md, "AdamW: subnormal moments"). Also the CUDA
// kernels' (optim_math.h): a GPU has no such penalty, but the two devices store the same state.
ZAYA_HD inline float flush_subnormal(float x) { return fabsf(x) < FLT_MIN ? 0.0f : x; }

// One AdamW step t >= 1 (decoupled weight decay, bias-corrected moments):
//   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²  (each through flush_subnormal);
//   m̂ = m/(1−β1^t);  v̂ = v/(1−β2^t)
//   p ← p − lr·(m̂/(√v̂ + eps) + wd·p)
void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad, const AdamWHyper& hp,
                  int64_t step);

// Muon's element passes around Newton–Schulz (optim_math.h): the momentum with its Nesterov
// look-ahead, grad ← grad + β·m after m ← β·m + grad (grad becomes what is orthogonalized), and
// the update param ← param − lr·(wd·param + scale·update). Same-shape f32 tensors.
void muon_momentum(const Tensor& grad, const Tensor& m, float beta);
void muon_apply(const Tensor& param, const Tensor& update, float lr, float weight_decay, float scale);

}  // namespace zaya::ops
