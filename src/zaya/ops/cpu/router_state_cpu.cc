// EDA on the CPU: rows split among threads; the parameter gradient's sum over rows goes in fixed
// row chunks added in chunk order, so it does not depend on the thread count.
#include "zaya/ops/cpu/router_state_cpu.h"

#include <algorithm>
#include <vector>

namespace zaya::ops::cpu {

void eda_forward(float* r, const float* r_prev, const float* s, int64_t N, int64_t R) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < R; ++j) r[i * R + j] += s[j] * r_prev[i * R + j];
}

// One pass over the rows: [N, R] is read row by row (a column-by-column walk read each cache line
// R/16 times), in fixed 256-row chunks whose partial ds are added in chunk order.
void eda_backward(float* d, float* c, const float* r_prev, const float* s, float* ds, int64_t N, int64_t R) {
  constexpr int64_t kRows = 256;
  const int64_t chunks = (N + kRows - 1) / kRows;
  std::vector<float> part(r_prev ? static_cast<size_t>(chunks * R) : 0, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t i = ch * kRows; i < std::min(N, (ch + 1) * kRows); ++i) {
      float* di = d + i * R;
      float* ci = c + i * R;
      for (int64_t j = 0; j < R; ++j) di[j] += ci[j];
      if (!r_prev) continue;
      const float* ri = r_prev + i * R;
      float* pj = part.data() + ch * R;
      for (int64_t j = 0; j < R; ++j) {
        pj[j] += di[j] * ri[j];
        ci[j] = di[j] * s[j];
      }
    }
  if (r_prev)
    for (int64_t ch = 0; ch < chunks; ++ch)
      for (int64_t j = 0; j < R; ++j) ds[j] += part[ch * R + j];
}

}  // namespace zaya::ops::cpu
