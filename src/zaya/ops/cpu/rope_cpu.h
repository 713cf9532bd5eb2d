// Raw-pointer CPU kernel behind zaya/ops/rope.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

// One token's heads at one position: c, s are that position's rows of the cos/sin tables
// (rot/2 each). sign = +1 rotates by φ (forward), −1 by −φ (backward). y may equal x.
inline void rope_token(float* y, const float* x, const float* c, const float* s, int64_t rot, int64_t heads,
                       int64_t hd, float sign) {
  const int64_t half = rot / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* xi = x + h * hd;
    float* yo = y + h * hd;
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

// Every token of [B, T, heads, hd] at positions t + pos_offset. y may equal x.
void rope_apply(float* y, const float* x, const float* cos, const float* sin, int64_t rot, int64_t B,
                int64_t T, int64_t heads, int64_t hd, int64_t pos_offset, float sign);

}  // namespace zaya::ops::cpu
