// The skip-class passthrough's CPU kernels (math in zaya/ops/moe_skip.h; per-element math shared
// with CUDA in zaya/ops/moe_skip_math.h). Each token's row is independent, so the results are
// bitwise the same for any thread count. A choice outside [0, E] is never equal to E: such a row
// is left alone here (moe_plan reports it).
#include "zaya/ops/cpu/moe_skip_cpu.h"

#include "zaya/ops/moe_skip_math.h"
#include "zaya/ops/router_math.h"

namespace zaya::ops::cpu {

void moe_skip_forward(float* out, const float* x, const float* probs, const int32_t* choice, int64_t N, int64_t E,
                      int64_t H) {
  const int64_t K = E + 1;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (choice[n] != E) continue;
    const float p = probs[n * K + E];
    for (int64_t h = 0; h < H; ++h) out[n * H + h] = math::skip_passthrough(p, x[n * H + h]);
  }
}

void moe_skip_input_backward(float* dx, const float* dout, const float* probs, const int32_t* choice, int64_t N,
                             int64_t E, int64_t H) {
  const int64_t K = E + 1;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (choice[n] != E) continue;
    const float p = probs[n * K + E];
    for (int64_t h = 0; h < H; ++h) dx[n * H + h] = math::skip_passthrough_dx(dx[n * H + h], p, dout[n * H + h]);
  }
}

void moe_skip_router_backward(float* dlogits, const float* dout, const float* x, const float* probs,
                              const int32_t* choice, int64_t N, int64_t E, int64_t H) {
  const int64_t K = E + 1;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (choice[n] != E) continue;
    // s = dL/dp_skip = ⟨dout, x⟩ in h order; then through the softmax as moe_route_backward does
    // for a routed token's weight: dz_e = s·p_E·(δ_Ee − p_e).
    float s = 0.0f;
    for (int64_t h = 0; h < H; ++h) s += dout[n * H + h] * x[n * H + h];
    const float* p = probs + n * K;
    const float a = s * p[E];
    for (int64_t e = 0; e < K; ++e) dlogits[n * K + e] = math::route_logit_grad(a, p[e], e == E);
  }
}

}  // namespace zaya::ops::cpu
