// Small vector helpers for the sequence-op kernels. Without -ffast-math the compiler may not
// reorder a float reduction, so dot() keeps 16 independent partial sums (which it does vectorize)
// and adds them in a fixed order: the result depends only on n, never on threads or alignment.
#pragma once

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

// y += a·x
inline void axpyf(float* __restrict y, float a, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace zaya::ops::cpu
