// Small vector helpers for the sequence-op kernels. Without -ffast-math the compiler may not
// reorder a float reduction, so dot() keeps 16 independent partial sums (which it does vectorize)
// and adds them in a fixed order: the result depends only on n, never on threads or alignment.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace zaya::ops::cpu {

inline float dotf(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// exp(x), branch-free so loops over arrays vectorize (libm's expf is a scalar call: 1-3 GB/s):
// x = n·ln2 + r with |r| ≤ ln2/2, a degree-7 polynomial for e^r (Cephes' coefficients, ~1 ulp) and
// 2^n put into the exponent bits. x is clamped to [−87, 88] so 2^n stays a normal float: below
// −87 the result is ~1.6e-38 instead of 0 or a denormal, above 88 it saturates at ~1.65e38.
inline float expf_fast(float x) {
  const float v = std::min(std::max(x, -87.0f), 88.0f);
  // Round v·log2(e) to the nearest integer by adding and subtracting 1.5·2^23.
  const float t = v * 1.44269504088896341f + 12582912.0f;
  const float nf = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;  // bits of 12582912.0f
  const float r = v - nf * 0.693359375f - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// erf(x), branch-free so loops over arrays vectorize (libm's erff is a scalar call: ~1 GB/s in
// GELU). Two pieces, both computed and one selected (a blend, not a branch):
//   |x| < 0.921875:  erf(x) = x·P(x²), P of degree 6;
//   |x| ≥ 0.921875:  erf(x) = 1 − exp(Q(|x| − 0.921875)), Q of degree 6 fitting log(erfc) on
//                    [0.921875, 3.95]; |x| is clamped to 3.95, where erf rounds to 1 in float.
// The coefficients are our own near-minimax fits (Lawson-weighted least squares in double against
// math.erf/erfc): fit error 4e-10 relative (small piece) and 1.5e-9 absolute (large piece), far
// below float rounding. Measured in float against std::erf in double over a dense grid of [−6, 6]
// (tests/ops/test_dense.cc, ErfFastWithinOneUlpOfDouble): at most 1.08 ulp (the spacing of floats
// at |erf(x)|), |error| ≤ 6.5e-8, with GCC's FMA contraction on an AVX-512 build.
// NaN propagates; ±inf gives ±1.
inline float erf_fast(float x) {
  const float ax = std::fabs(x);
  // Small piece, as x + x·(P(z) − 1): the correction is ≤ 0.13·x, so its rounding barely shows.
  const float z = ax * ax;
  float ps = 8.397944147171374e-05f;
  ps = ps * z - 0.000814984680473014f;
  ps = ps * z + 0.00520172038508697f;
  ps = ps * z - 0.026859704445626742f;
  ps = ps * z + 0.11283701672846776f;
  ps = ps * z - 0.37612634193906536f;
  ps = ps * z + 0.1283791666937848f;
  ps = ax + ax * ps;
  // Large piece, in t = |x| − 0.921875 ≥ 0 so that where erfc is largest (small t) Q is nearly
  // its constant term and the Horner sums do not cancel. std::min keeps a NaN (it returns its
  // first argument unless the second is less).
  const float t = std::min(ax, 3.95f) - 0.921875f;
  float q = 0.00019473477240374365f;
  q = q * t - 0.0019544765406162095f;
  q = q * t + 0.01069005230437723f;
  q = q * t - 0.04475783668832739f;
  q = q * t - 0.8330012284106131f;
  q = q * t - 2.5080117426968522f;
  q = q * t - 1.6485619013387776f;
  const float pl = 1.0f - expf_fast(q);
  return std::copysign(ax < 0.921875f ? ps : pl, x);
}

// max over x[0..n) (−inf for n = 0). Max is exact, so 16 lanes give the same result as one.
inline float maxf(const float* x, int64_t n) {
  float acc[16];
  std::fill_n(acc, 16, -INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] = std::max(acc[l], x[i + l]);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] = std::max(acc[l], x[i]);
  float m = acc[0];
  for (int l = 1; l < 16; ++l) m = std::max(m, acc[l]);
  return m;
}

// Σ exp(x[i] − shift) with 16 partial sums in a fixed order (like dotf), so it vectorizes and the
// result depends only on n.
inline float sum_expf(const float* x, int64_t n, float shift) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += expf_fast(x[i + l] - shift);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += expf_fast(x[i] - shift);
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// y += a·x
inline void axpyf(float* __restrict y, float a, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace zaya::ops::cpu
