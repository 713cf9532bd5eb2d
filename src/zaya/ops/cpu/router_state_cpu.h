// Raw-pointer CPU kernels behind zaya/ops/router_state.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

void eda_forward(float* r, const float* r_prev, const float* s, int64_t N, int64_t R);
// r_prev, s and ds all null for a layer without EDA.
void eda_backward(float* dr, float* carried, const float* r_prev, const float* s, float* ds, int64_t N, int64_t R);

}  // namespace zaya::ops::cpu
