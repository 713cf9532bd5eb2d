// Rotate-half RoPE on the first `rot` dims of each head (math in zaya/ops/rope.h).
#include "zaya/ops/cpu/rope_cpu.h"

namespace zaya::ops::cpu {

void rope_apply(float* y, const float* x, const float* cos, const float* sin, int64_t rot, int64_t B,
                int64_t T, int64_t heads, int64_t hd, int64_t pos_offset, float sign) {
  const int64_t half = rot / 2;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t pos = bt % T + pos_offset;
    rope_token(y + bt * heads * hd, x + bt * heads * hd, cos + pos * half, sin + pos * half, rot, heads, hd, sign);
  }
}

}  // namespace zaya::ops::cpu
