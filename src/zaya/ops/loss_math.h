// The cross-entropy's per-row and per-element math (ops/loss.h), as __host__ __device__ functions
// for the CUDA kernels (ops/cuda/loss.cu). The CPU kernels (ops/cpu/loss_cpu.cc, the fused head)
// keep their vectorized forms (expf_fast, 16 partial sums); these follow the same formulas, the
// same order of roundings and the same small-probability flush with the C library's expf (CUDA's on
// the device, ≤ 2 ulp), and tests/ops/test_loss.cc checks them against the CPU op on the host.
#pragma once

#include <math.h>

#include "zaya/core/dtype.h"  // ZAYA_HD

namespace zaya::ops::math {

// Probabilities below this are stored as exact 0 where they feed the head's GEMMs, as on the CPU
// (cpu::kTinyProbability, which loss_cpu.cc checks equal): their contribution is far below float's
// resolution of any sum they enter.
constexpr float kTinyProbability = 0x1p-100f;

// The online logsumexp across vocabulary chunks: a row's running max m and Σ exp(logit − m) move to
// a chunk's max when it is larger (exp(−inf) = 0 on the first chunk), before the chunk's terms are
// added relative to the new m. Σ stays ≤ the number of columns seen.
ZAYA_HD inline void lse_raise_max(float& m, float& sum, float chunk_max) {
  if (chunk_max > m) {
    sum *= expf(m - chunk_max);
    m = chunk_max;
  }
}

// d loss / d logit for one element of a counted row: (p − [is_target]) / count with
// p = exp(logit − lse), stored as 0 below kTinyProbability, scaled first and the one-hot term
// subtracted after (two roundings, as on the CPU: never one fused multiply-add).
ZAYA_HD inline float xent_logit_grad(float logit, float lse, float inv_count, bool is_target) {
  float p = expf(logit - lse);
  p = p < kTinyProbability ? 0.0f : p;
#if defined(__CUDA_ARCH__)
  const float g = __fmul_rn(p, inv_count);
  return is_target ? __fsub_rn(g, inv_count) : g;
#else
  const float g = p * inv_count;
  return is_target ? g - inv_count : g;
#endif
}

}  // namespace zaya::ops::math
