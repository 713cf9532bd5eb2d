// Raw-pointer CPU kernels behind zaya/ops/scale_bias.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

void scale_bias_forward(const float* x, const float* b, const float* g, float* y, int64_t N, int64_t F);
void scale_bias_backward(const float* dy, const float* x, const float* b, const float* g, float* dx, float* db,
                         float* dg, int64_t N, int64_t F);

}  // namespace zaya::ops::cpu
