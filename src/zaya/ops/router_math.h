// The router's per-row math (ops/moe.h), as __host__ __device__ functions: the CPU kernel
// (ops/cpu/moe_cpu.cc) and the CUDA kernel (ops/cuda/moe.cu) run the same code, so a routing
// decision is made by the same operations in the same order on both devices, ties broken the same
// way. The only difference left is the exponential: the C library's expf on the host, CUDA's expf
// (≤ 2 ulp) on the device; the max, the sum in class order, the IEEE division and the biased
// comparisons are exact or correctly rounded on both. tests/ops/test_moe.cc runs these on the host.
#pragma once

#include <math.h>

#include <cstdint>

#include "zaya/core/dtype.h"  // ZAYA_HD

namespace zaya::ops::math {

// One token's router row of K = E + 1 classes (class E = skip): p = softmax(z), then the biased
// choice argmax_e (p_e + β_e), the lowest index on a tie (strict '>'). Returns the choice. p may be
// z (in place). The max is std::max's rule ((m < z) ? z : m), the sum in class order.
ZAYA_HD inline int32_t route_row(float* p, const float* z, const float* beta, int64_t K) {
  float mx = z[0];
  for (int64_t e = 1; e < K; ++e) mx = (mx < z[e]) ? z[e] : mx;
  float sum = 0.0f;
  for (int64_t e = 0; e < K; ++e) {
    p[e] = expf(z[e] - mx);
    sum += p[e];
  }
  for (int64_t e = 0; e < K; ++e) p[e] /= sum;
  int32_t best = 0;
  float best_v = p[0] + beta[0];
  for (int64_t e = 1; e < K; ++e) {
    const float v = p[e] + beta[e];
    if (v > best_v) best_v = v, best = static_cast<int32_t>(e);
  }
  return best;
}

// d weight / d z_e through p_c: dweight·p_c·(δ_ce − p_e), with a = dweight·p_c, as −a·p_e, plus a
// for the chosen class: two roundings, never one fused multiply-add (nvcc would contract them;
// g++ in ISO C++ mode does not), so both devices give the same bits.
ZAYA_HD inline float route_logit_grad(float a, float p_e, bool chosen) {
#if defined(__CUDA_ARCH__)
  const float g = __fmul_rn(-a, p_e);
  return chosen ? __fadd_rn(g, a) : g;
#else
  const float g = -a * p_e;
  return chosen ? g + a : g;
#endif
}

}  // namespace zaya::ops::math
