// MoE routing and permutation kernels (math in zaya/ops/moe.h). All per-row, so bitwise
// deterministic for any thread count; the plan is a serial O(N) counting sort (stable by design).
// The router's row math is shared with the CUDA kernel (zaya/ops/router_math.h).
#include "zaya/ops/cpu/moe_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/router_math.h"

namespace zaya::ops::cpu {

void moe_route(float* probs, int32_t* choice, float* weight, const float* logits, const float* beta, int64_t N,
               int64_t E) {
  const int64_t K = E + 1;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* p = probs + n * K;
    const int32_t best = math::route_row(p, logits + n * K, beta, K);
    choice[n] = best;
    weight[n] = best == E ? 0.0f : p[best];
  }
}

void moe_route_bwd(float* dlogits, const float* dweight, const float* probs, const int32_t* choice, int64_t N,
                   int64_t E) {
  const int64_t K = E + 1;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* g = dlogits + n * K;
    const float* p = probs + n * K;
    const int64_t c = choice[n];
    if (c == E) {  // skip: the weight is the constant 0
      std::fill_n(g, K, 0.0f);
      continue;
    }
    // d p_c / d z_e = p_c (δ_ce − p_e)
    const float a = dweight[n] * p[c];
    for (int64_t e = 0; e < K; ++e) g[e] = math::route_logit_grad(a, p[e], e == c);
  }
}

int64_t moe_plan(int32_t* counts, int32_t* offsets, int32_t* pos, int32_t* src, const int32_t* choice, int64_t N,
                 int64_t E) {
  std::fill_n(counts, E, 0);
  for (int64_t n = 0; n < N; ++n)
    if (choice[n] < E) ++counts[choice[n]];
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  std::vector<int32_t> next(offsets, offsets + E);
  for (int64_t n = 0; n < N; ++n) {
    if (choice[n] == E) {
      pos[n] = -1;
      continue;
    }
    const int32_t r = next[choice[n]]++;
    pos[n] = r;
    src[r] = static_cast<int32_t>(n);
  }
  return offsets[E];
}

void moe_gather(float* xp, const float* x, const int32_t* src, int64_t M, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; ++r) std::copy_n(x + static_cast<int64_t>(src[r]) * H, H, xp + r * H);
}

void moe_gather_bwd(float* dx, const float* dxp, const int32_t* pos, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (pos[n] < 0) std::fill_n(dx + n * H, H, 0.0f);
    else std::copy_n(dxp + static_cast<int64_t>(pos[n]) * H, H, dx + n * H);
  }
}

void moe_unpermute(float* out, const float* y, const float* weight, const int32_t* pos, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * H;
    if (pos[n] < 0) {
      std::fill_n(o, H, 0.0f);
      continue;
    }
    const float* yr = y + static_cast<int64_t>(pos[n]) * H;
    for (int64_t h = 0; h < H; ++h) o[h] = weight[n] * yr[h];
  }
}

namespace {
// ⟨a, b⟩ with b in bf16: b widened exactly into the calling thread's buffer, then dotf itself, so
// the bits of dotf on the widened b (one compiled reduction: a copy of dotf reading bf16 could be
// compiled to other contractions).
float dot_row(const float* a, const bf16* b, int64_t n) {
  thread_local AlignedVector<float> wide;
  if (wide.size() < static_cast<size_t>(n)) wide.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) wide[static_cast<size_t>(i)] = to_float(b[i]);
  return dotf(a, wide.data(), n);
}
float dot_row(const float* a, const float* b, int64_t n) { return dotf(a, b, n); }

template <class T>
void unpermute_bwd(float* dy, float* dweight, const float* dout, const T* y, const float* weight, const int32_t* pos,
                   int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (pos[n] < 0) {
      dweight[n] = 0.0f;
      continue;
    }
    const int64_t r = pos[n];
    const float* g = dout + n * H;
    dweight[n] = dot_row(g, y + r * H, H);
    for (int64_t h = 0; h < H; ++h) dy[r * H + h] = weight[n] * g[h];
  }
}
}  // namespace

void moe_unpermute_bwd(float* dy, float* dweight, const float* dout, const float* y, const float* weight,
                       const int32_t* pos, int64_t N, int64_t H) {
  unpermute_bwd(dy, dweight, dout, y, weight, pos, N, H);
}

void moe_unpermute_bwd(float* dy, float* dweight, const float* dout, const bf16* y, const float* weight,
                       const int32_t* pos, int64_t N, int64_t H) {
  unpermute_bwd(dy, dweight, dout, y, weight, pos, N, H);
}

}  // namespace zaya::ops::cpu
