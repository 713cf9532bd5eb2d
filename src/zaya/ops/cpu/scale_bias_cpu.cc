// y = (x + b) ⊙ g on the CPU, forward and backward side by side.
#include "zaya/ops/cpu/scale_bias_cpu.h"

#include <algorithm>

namespace zaya::ops::cpu {

void scale_bias_forward(const float* x, const float* b, const float* g, float* y, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < F; ++j) y[i * F + j] = (x[i * F + j] + b[j]) * g[j];
}

// dx = dy ⊙ g,  db += Σ_rows dx,  dg += Σ_rows dy ⊙ (x + b). Column sums in row order, one thread
// per block of 16 columns (the rows are walked once, 16 contiguous floats at a time, instead of
// once per column at stride F): deterministic for any thread count.
void scale_bias_backward(const float* dy, const float* x, const float* b, const float* g, float* dx, float* db,
                         float* dg, int64_t N, int64_t F) {
  constexpr int64_t kColBlock = 16;
#pragma omp parallel for schedule(static)
  for (int64_t j0 = 0; j0 < F; j0 += kColBlock) {
    const int64_t nc = std::min(kColBlock, F - j0);
    float sg[kColBlock] = {}, sb[kColBlock] = {};
    for (int64_t i = 0; i < N; ++i) {
      const float* dyr = dy + i * F + j0;
      const float* xr = x + i * F + j0;
      float* dxr = dx + i * F + j0;
      for (int64_t c = 0; c < nc; ++c) {
        const float d = dyr[c];
        dxr[c] = d * g[j0 + c];
        sb[c] += d * g[j0 + c];
        sg[c] += d * (xr[c] + b[j0 + c]);
      }
    }
    for (int64_t c = 0; c < nc; ++c) {
      dg[j0 + c] += sg[c];
      db[j0 + c] += sb[c];
    }
  }
}

}  // namespace zaya::ops::cpu
