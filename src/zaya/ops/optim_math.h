// The per-element math of the optimizer primitives, as __host__ __device__ functions: the CPU
// kernel (ops/cpu/optim_ops_cpu.cc, its scalar part) and the CUDA kernel (ops/cuda/optim_ops.cu)
// run the same function, so the AdamW step a GPU runs is tested on machines without one.
//
// Every operation here is an IEEE-rounded one on both devices (fmaf, sqrtf, division; nvcc rounds
// sqrt and division correctly unless built with --use_fast_math, which zaya is not), and no a·b + c
// is left for a compiler to contract: the two devices give bitwise the same moments and parameters.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>

#include "zaya/core/dtype.h"  // ZAYA_HD
#include "zaya/ops/optim_ops.h"

namespace zaya::ops::math {

// global_grad_norm's fixed blocks: each tensor is cut into blocks of this many elements, each block
// summed in 16 lanes (lane l adds the elements ≡ l mod 16 in order; the lanes combine as
// ((0..7)+(8..15)), then ((0..3)+(4..7)), then (0+2)+(1+3)), the block sums added in block order
// and the tensors' sums in tensor order, all in double. The CPU and CUDA kernels both follow it, so
// the norm is bitwise the same on both devices and for any thread count.
constexpr int64_t kNormBlock = 16384;
constexpr int kNormLanes = 16;

// An AdamW step's constants: β1, 1−β1, β2, 1−β2, the bias corrections as multipliers
// (m̂ = m·inv_bc1, √v̂ = √v·inv_sqrt_bc2), lr, eps, weight decay.
struct AdamWConsts {
  float b1, c1, b2, c2, inv_bc1, inv_sqrt_bc2, lr, eps, wd;
};

// The constants of step t >= 1. The bias corrections in double (1 − 0.95^t loses digits in float
// for small t), applied as multipliers, so the element step has one sqrt and one division and no
// double arithmetic.
inline AdamWConsts adamw_consts(const AdamWHyper& hp, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  return {hp.beta1,
          1.0f - hp.beta1,
          hp.beta2,
          1.0f - hp.beta2,
          static_cast<float>(1.0 / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          hp.lr,
          hp.eps,
          hp.weight_decay};
}

// One element: m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g² (each through flush_subnormal);
// p ← p − lr·(m̂/(√v̂ + eps) + wd·p). Each multiply-add is an explicit fused one.
ZAYA_HD inline void adamw_step(float& p, float g, float& m, float& v, const AdamWConsts& k) {
  const float mi = flush_subnormal(fmaf(k.b1, m, k.c1 * g));
  const float vi = flush_subnormal(fmaf(k.b2, v, (k.c2 * g) * g));
  m = mi;
  v = vi;
  const float upd = (mi * k.inv_bc1) / fmaf(sqrtf(vi), k.inv_sqrt_bc2, k.eps);
  p = fmaf(-k.lr, fmaf(k.wd, p, upd), p);  // p − lr·(upd + wd·p)
}

// Muon's momentum with the Nesterov look-ahead, one element: m ← β·m + g (flushed as AdamW's
// moments: an expert no token reaches has g = 0 and its momentum decays), g ← g + β·m.
ZAYA_HD inline void muon_momentum_step(float& g, float& m, float beta) {
  const float mi = flush_subnormal(beta * m + g);
  m = mi;
  g = g + beta * mi;
}

// Muon's update, one element: p ← p − lr·(wd·p + s·o), decoupled weight decay and the scaled
// orthogonalized update both reading the pre-step p.
ZAYA_HD inline void muon_apply_step(float& p, float o, float lr, float wd, float s) { p -= lr * (wd * p + s * o); }

}  // namespace zaya::ops::math
