// The per-element math of the activations, as __host__ __device__ functions: the CUDA kernels
// (ops/cuda/dense.cu) call them on the device, and the CPU tests call the same functions on the
// host against float64 formulas (tests/ops/test_elementwise_math.cc), so the math a GPU runs is
// tested on machines without one.
//
// The CPU kernels (ops/cpu/dense_cpu.cc) keep their own vectorized forms (expf_fast, erf_fast,
// AVX2 lanes); these follow the same formulas and the same tail rule with the C library's
// expf/erff (CUDA's device versions on the GPU: ≤ 2 ulp), so the two devices agree to a few ulp.
#pragma once

#include <math.h>

#include "zaya/core/dtype.h"  // ZAYA_HD

namespace zaya::ops::math {

// Below kTail, σ(x) < 1.9e-35 and φ(x) < 1e-35 are taken as exactly 0, as on the CPU: the values
// are below float's resolution next to any other term, and 0 keeps subnormals out of what follows.
constexpr float kTail = -80.0f;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// σ(x) = 1/(1 + e^{−x}).
ZAYA_HD inline float sigmoid(float x) {
  if (x < kTail) return 0.0f;
  return 1.0f / (1.0f + expf(-x));
}

// silu(x) = x·σ(x).
ZAYA_HD inline float silu(float x) { return x * sigmoid(x); }
// silu'(x) = σ(x)·(1 + x·(1 − σ(x))).
ZAYA_HD inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// Exact GELU: gelu(x) = ½x(1 + erf(x/√2)).
ZAYA_HD inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * kInvSqrt2)); }
// gelu'(x) = Φ(x) + x·φ(x), Φ(x) = ½(1 + erf(x/√2)), φ(x) = e^{−x²/2}/√(2π) (0 below the tail).
ZAYA_HD inline float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
  const float a = -0.5f * x * x;
  const float pdf = a < kTail ? 0.0f : kInvSqrt2Pi * expf(a);
  return cdf + x * pdf;
}

// SwiGLU on a gate g and a value v: y = silu(g)·v.
ZAYA_HD inline float swiglu(float g, float v) { return silu(g) * v; }
// Its gradients from dy: dg = dy·v·silu'(g), dv = dy·silu(g).
struct SwigluGrad {
  float dg, dv;
};
ZAYA_HD inline SwigluGrad swiglu_grad(float dy, float g, float v) {
  const float s = sigmoid(g);
  return {dy * v * s * (1.0f + g * (1.0f - s)), dy * g * s};
}

}  // namespace zaya::ops::math
