// Raw-pointer CPU kernel behind zaya/ops/rope.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

// sign = +1 rotates by φ (forward), −1 by −φ (backward). y may equal x.
void rope_apply(float* y, const float* x, const float* cos, const float* sin, int64_t rot, int64_t B,
                int64_t T, int64_t heads, int64_t hd, int64_t pos_offset, float sign);

}  // namespace zaya::ops::cpu
