// Rotate-half RoPE on the first `rot` dims of each head (math in zaya/ops/rope.h).
#include "zaya/ops/cpu/rope_cpu.h"

namespace zaya::ops::cpu {

void rope_apply(float* y, const float* x, const float* cos, const float* sin, int64_t rot, int64_t B,
                int64_t T, int64_t heads, int64_t hd, int64_t pos_offset, float sign) {
  const int64_t half = rot / 2;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t pos = bt % T + pos_offset;
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xi = x + (bt * heads + h) * hd;
      float* yo = y + (bt * heads + h) * hd;
      for (int64_t j = 0; j < half; ++j) {
        // Read both halves before writing: y may be x.
        float a = xi[j], b = xi[j + half], sn = sign * s[j];
        yo[j] = a * c[j] - b * sn;
        yo[j + half] = b * c[j] + a * sn;
      }
      if (yo != xi)
        for (int64_t d = rot; d < hd; ++d) yo[d] = xi[d];
    }
  }
}

}  // namespace zaya::ops::cpu
