// Raw-pointer CPU kernels behind zaya/ops/moe_skip.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

void moe_skip_forward(float* out, const float* x, const float* probs, const int32_t* choice, int64_t N, int64_t E,
                      int64_t H);
void moe_skip_input_backward(float* dx, const float* dout, const float* probs, const int32_t* choice, int64_t N,
                             int64_t E, int64_t H);
void moe_skip_router_backward(float* dlogits, const float* dout, const float* x, const float* probs,
                              const int32_t* choice, int64_t N, int64_t E, int64_t H);

}  // namespace zaya::ops::cpu
