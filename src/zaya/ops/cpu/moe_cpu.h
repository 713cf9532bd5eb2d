// Raw-pointer CPU kernels behind zaya/ops/moe.h (arguments already checked there).
#pragma once

#include <cstdint>

#include "zaya/core/dtype.h"

namespace zaya::ops::cpu {

void moe_route(float* probs, int32_t* choice, float* weight, const float* logits, const float* beta, int64_t N,
               int64_t E);
void moe_route_bwd(float* dlogits, const float* dweight, const float* probs, const int32_t* choice, int64_t N,
                   int64_t E);
int64_t moe_plan(int32_t* counts, int32_t* offsets, int32_t* pos, int32_t* src, const int32_t* choice, int64_t N,
                 int64_t E);
void moe_gather(float* xp, const float* x, const int32_t* src, int64_t M, int64_t H);
void moe_gather_bwd(float* dx, const float* dxp, const int32_t* pos, int64_t N, int64_t H);
void moe_unpermute(float* out, const float* y, const float* weight, const int32_t* pos, int64_t N, int64_t H);
void moe_unpermute_bwd(float* dy, float* dweight, const float* dout, const float* y, const float* weight,
                       const int32_t* pos, int64_t N, int64_t H);
// The same with y in bf16 (the saved copy of bf16 activations), widened exactly as it is read:
// bitwise the f32 kernel on the widened y.
void moe_unpermute_bwd(float* dy, float* dweight, const float* dout, const bf16* y, const float* weight,
                       const int32_t* pos, int64_t N, int64_t H);

}  // namespace zaya::ops::cpu
