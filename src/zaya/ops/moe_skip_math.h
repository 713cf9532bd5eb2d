// The per-element math of the skip-class passthrough (ops/moe_skip.h), as __host__ __device__
// functions: the CPU kernels (ops/cpu/moe_skip_cpu.cc) and the CUDA kernels (ops/cuda/moe_skip.cu)
// run the same code, so every element they write is the same product or sum on both devices. Each
// is one correctly rounded operation per step, never a fused multiply-add (nvcc would contract
// `d + p * g`; g++ in ISO C++ mode does not), so both devices give the same bits. The one reduction,
// ⟨dout, x⟩ for the router's gradient, is summed in another order on each device (ops/moe_skip.h).
#pragma once

#include "zaya/core/dtype.h"  // ZAYA_HD

namespace zaya::ops::math {

// Forward: a skipped token's MoE output element, p_skip · x.
ZAYA_HD inline float skip_passthrough(float p_skip, float x) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(p_skip, x);
#else
  return p_skip * x;
#endif
}

// Backward into the input: dx + p_skip · dout, rounded after the product and after the sum.
ZAYA_HD inline float skip_passthrough_dx(float dx, float p_skip, float dout) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(dx, __fmul_rn(p_skip, dout));
#else
  const float g = p_skip * dout;
  return dx + g;
#endif
}

}  // namespace zaya::ops::math
