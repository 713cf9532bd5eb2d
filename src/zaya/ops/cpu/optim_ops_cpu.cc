// CPU kernels of the optimizer primitives (optim_ops.h; arguments checked by the fronts in
// ops/optim_ops.cc).
#include "zaya/ops/cpu/optim_ops_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "zaya/ops/optim_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace zaya::ops::cpu {
namespace {

using math::kNormBlock;  // the block and lane order shared with the CUDA kernel (optim_math.h)
constexpr int64_t kAdamChunk = 8192;  // elements per thread work item

// Σ x² over x[0..n) in double, 16 lanes: x² of a float is exact in double, each lane adds every
// 16th element in order, and the lanes are added in a fixed order (a vectorized loop, where one
// running double sum is a serial chain at ~1 element per add latency).
double sum_squares_block(const float* x, int64_t n) {
  double lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lane[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  for (int l = 0; i < n; ++i, ++l) lane[l] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  for (int l = 0; l < 8; ++l) lane[l] += lane[l + 8];
  for (int l = 0; l < 4; ++l) lane[l] += lane[l + 4];
  return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

// Σ x² of one tensor in double: fixed blocks, block sums combined in block order.
double sum_squares(const float* x, int64_t n) {
  int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  if (blocks <= 1) return sum_squares_block(x, n);
  std::vector<double> partial(blocks);  // one small vector per call, outside any per-token loop
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t i0 = b * kNormBlock, i1 = std::min(n, i0 + kNormBlock);
    partial[b] = sum_squares_block(x + i0, i1 - i0);
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

using math::AdamWConsts;

// One chunk of the AdamW update. Every element is independent, and the AVX-512 body does the same
// IEEE operations in the same order as the scalar one (math::adamw_step, optim_math.h, which the
// CUDA kernel runs too), so both give bitwise the same result. Each multiply-add is an explicit
// fused one in both (GCC contracts a·b + c into an FMA on its own in C++, and might pick different
// pairs in the two bodies). The explicit vectors are there because GCC does not vectorize the
// scalar loop: with errno-setting math (its default) each sqrt carries a branch for negative input.
//
// Moments that fall below float's normal range are stored as 0 (flush_subnormal: by value, no FP
// mode is set). A parameter whose gradient stays 0 (the embedding row of a token no batch holds)
// has its first moment decay by β1 every step, subnormal after ~650 steps from 1e-10, and then
// every step on it ran through microcode assists. A flushed moment is < 2^-126, whose part of the
// update, m̂/(√v̂ + eps) with eps = 1e-8, is below 1e-30.
void adamw_chunk(float* p, const float* g, float* mp, float* vp, int64_t n, const AdamWConsts& k) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 b1 = _mm512_set1_ps(k.b1), c1 = _mm512_set1_ps(k.c1), b2 = _mm512_set1_ps(k.b2);
  const __m512 c2 = _mm512_set1_ps(k.c2), ib1 = _mm512_set1_ps(k.inv_bc1),
               isb2 = _mm512_set1_ps(k.inv_sqrt_bc2);
  const __m512 nlr = _mm512_set1_ps(-k.lr), eps = _mm512_set1_ps(k.eps), wd = _mm512_set1_ps(k.wd);
  const __m512 normal_min = _mm512_set1_ps(FLT_MIN);
  auto flush = [&](__m512 x) {  // flush_subnormal: |x| < FLT_MIN → 0, NaN kept
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x), normal_min, _CMP_NLT_UQ), x);
  };
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i), pi = _mm512_loadu_ps(p + i);
    const __m512 mi = flush(_mm512_fmadd_ps(b1, _mm512_loadu_ps(mp + i), _mm512_mul_ps(c1, gi)));
    const __m512 vi =
        flush(_mm512_fmadd_ps(b2, _mm512_loadu_ps(vp + i), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi)));
    _mm512_storeu_ps(mp + i, mi);
    _mm512_storeu_ps(vp + i, vi);
    // All-lanes masked sqrt = _mm512_sqrt_ps, whose _mm512_undefined_ps() trips GCC 12's
    // -Wmaybe-uninitialized.
    const __m512 sq = _mm512_mask_sqrt_ps(vi, static_cast<__mmask16>(0xFFFF), vi);
    const __m512 den = _mm512_fmadd_ps(sq, isb2, eps);
    const __m512 upd = _mm512_div_ps(_mm512_mul_ps(mi, ib1), den);
    _mm512_storeu_ps(p + i, _mm512_fmadd_ps(nlr, _mm512_fmadd_ps(wd, pi, upd), pi));
  }
#endif
  for (; i < n; ++i) math::adamw_step(p[i], g[i], mp[i], vp[i], k);
}

}  // namespace

double global_grad_norm(std::span<const Tensor> grads) {
  double total = 0;
  for (size_t i = 0; i < grads.size(); ++i) total += sum_squares(grads[i].data<float>(), grads[i].numel());
  return std::sqrt(total);
}

void scale_inplace(const Tensor& t, float s) {
  float* p = t.data<float>();
  int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad,
                  const AdamWHyper& hp, int64_t step) {
  const AdamWConsts k = math::adamw_consts(hp, step);  // the element loop vectorizes
  float* __restrict p = param.data<float>();
  float* __restrict mp = m.data<float>();
  float* __restrict vp = v.data<float>();
  const float* __restrict g = grad.data<float>();
  const int64_t n = param.numel();
  const int64_t chunks = (n + kAdamChunk - 1) / kAdamChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kAdamChunk, i1 = std::min(n, i0 + kAdamChunk);
    adamw_chunk(p + i0, g + i0, mp + i0, vp + i0, i1 - i0, k);
  }
}

void muon_momentum(const Tensor& grad, const Tensor& m, float beta, bool on_this_thread) {
  float* g = grad.data<float>();
  float* mp = m.data<float>();
  const int64_t n = grad.numel();
#pragma omp parallel for schedule(static) if (!on_this_thread)
  for (int64_t i = 0; i < n; ++i) math::muon_momentum_step(g[i], mp[i], beta);
}

void muon_apply(const Tensor& param, const Tensor& update, float lr, float weight_decay, float scale,
                bool on_this_thread) {
  float* p = param.data<float>();
  const float* o = update.data<float>();
  const int64_t n = param.numel();
#pragma omp parallel for schedule(static) if (!on_this_thread)
  for (int64_t i = 0; i < n; ++i) math::muon_apply_step(p[i], o[i], lr, weight_decay, scale);
}

}  // namespace zaya::ops::cpu
