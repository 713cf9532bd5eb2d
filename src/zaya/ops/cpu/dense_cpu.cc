// CPU kernels for dense.h (arguments checked by the fronts in ops/dense.cc): forward and backward
// side by side, the math written out (llm.c style).
// Threads split rows (independent). Sums over rows go either by columns (each column summed by one
// thread) or by fixed row chunks whose partials are then added in chunk order (the norms and the
// residual scaling, which read each row once): either way the order depends only on the shapes,
// so results do not depend on the thread count.
#include "zaya/ops/cpu/dense_cpu.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "zaya/core/cpu_caches.h"
#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/elementwise_math.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cpu {
namespace {

int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(-1); }
int64_t rows_of(const Tensor& t) {
  int64_t f = last_dim(t);
  return f == 0 ? 0 : t.numel() / f;
}

// Σ_i a[i]·b[i] in a fixed order: 16 running lanes (so the compiler can vectorize it), the tail,
// then the lanes in order. The order depends only on n, never on threads.
inline float dot_fixed(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lane[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += lane[j];
  return s;
}

// out[j] += Σ_n term(n, j): each block of 64 columns belongs to one thread, which adds rows in
// order into a zero-started local sum and adds that to out once.
constexpr int64_t kColBlock = 64;
// Row chunk of RMSNorm's one-pass backward: per-chunk partial weight-gradient sums, added in chunk
// order (a fixed order for any thread count).
constexpr int64_t kNormRowChunk = 64;
template <class Term>
void column_reduce(int64_t rows, int64_t cols, float* out, Term term) {
  int64_t blocks = (cols + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, c1 = std::min(cols, c0 + kColBlock);
    float acc[kColBlock] = {};
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t j = c0; j < c1; ++j) acc[j - c0] += term(n, j);
    for (int64_t j = c0; j < c1; ++j) out[j] += acc[j - c0];
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// linear: y = x·Wᵀ + b.  dx = dy·W,  dW += dyᵀ·x,  db += Σ_rows dy.

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b) {
  int64_t n = x.size(0), out = W.size(0);
  ops::gemm(y, x, Trans::N, W, Trans::T, 1.0f, 0.0f);
  if (b.defined()) {
    const float* bp = b.data<float>();
    float* yp = y.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) yp[i * out + j] += bp[j];
  }
}

void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx) {
  int64_t n = x.size(0), out = W.size(0);
  // The GEMM operand that stands for dy: dy itself (f32), or its bf16 copy next to bf16 x and W.
  Tensor g = dy;
  if (x.dtype() == DType::bf16) {
    const float* s = dy.data<float>();
    bf16* d = dy_bf16.data<bf16>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n * out; ++i) d[i] = to_bf16(s[i]);
    g = dy_bf16;
  }
  if (dx.defined()) ops::gemm(dx, g, Trans::N, W, Trans::N, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  if (dW.defined()) ops::gemm(dW, g, Trans::T, x, Trans::N, 1.0f, 1.0f);
  if (db.defined()) {
    const float* d = dy.data<float>();
    column_reduce(n, out, db.data<float>(), [&](int64_t i, int64_t j) { return d[i * out + j]; });
  }
}

// ---------------------------------------------------------------------------------------------
// embedding: y[n] = E[ids[n]].  dE[ids[n]] += dy[n] unless ids[n] == padding_idx.

namespace {
// The ids are read here, on the host, which is where a range check can run.
void check_ids(const char* op, const Tensor& ids, int64_t vocab) {
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    ZAYA_CHECK(p[i] >= 0 && p[i] < vocab, op, ": token id ", p[i], " at position ", i,
               " is outside the vocabulary [0, ", vocab, ")");
}
}  // namespace

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& E) {
  int64_t vocab = E.size(0), h = E.size(1), n = ids.numel();
  check_ids("embedding_forward", ids, vocab);
  const int32_t* id = ids.data<int32_t>();
  float* out = y.data<float>();
  if (E.dtype() == DType::bf16) {  // a bf16 table: each row widened (exact)
    const bf16* e = E.data<bf16>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const bf16* row = e + int64_t{id[i]} * h;
      for (int64_t j = 0; j < h; ++j) out[i * h + j] = to_float(row[j]);
    }
    return;
  }
  const float* e = E.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy_n(e + int64_t{id[i]} * h, h, out + i * h);
}

void embedding_backward(const Tensor& dE, const Tensor& dy, const Tensor& ids, int64_t padding_idx) {
  int64_t vocab = dE.size(0), h = dE.size(1), n = ids.numel();
  check_ids("embedding_backward", ids, vocab);
  const int32_t* id = ids.data<int32_t>();
  const float* g = dy.data<float>();
  float* de = dE.data<float>();
  // Threads own column blocks of H and walk the tokens in order, so repeated ids add up in token
  // order whatever the thread count (a scatter by rows would race on repeated ids).
  int64_t blocks = (h + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, c1 = std::min(h, c0 + kColBlock);
    for (int64_t i = 0; i < n; ++i) {
      if (id[i] == padding_idx) continue;
      float* row = de + int64_t{id[i]} * h;
      for (int64_t j = c0; j < c1; ++j) row[j] += g[i * h + j];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rmsnorm: r = 1/sqrt(mean(x²) + eps), x̂ = x·r, y = w ⊙ x̂.
// backward: with ĝ = dy ⊙ w, dx = r·(ĝ − x̂·mean(ĝ ⊙ x̂)),  dw += Σ_rows dy ⊙ x̂.

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  int64_t f = last_dim(x), n = rows_of(x);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
  // Rows taken in chunks as threads free up, here and in the other row-wise norm and residual ops:
  // with static halves, the quicker of two cores running at different speeds (a shared VM's vCPUs)
  // waits at the end of each of these memory-bound passes. Rows are independent, so the bits do not
  // change.
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = xp + i * f;
    float r = 1.0f / std::sqrt(dot_fixed(xi, xi, f) / static_cast<float>(f) + eps);
    rp[i] = r;
    for (int64_t j = 0; j < f; ++j) yp[i * f + j] = wp[j] * (xi[j] * r);
  }
}

namespace {

// dx of one row: x̂ = x·r, ĝ = dy ⊙ w, dx = r·(ĝ − x̂·mean(ĝ ⊙ x̂)), the mean in a fixed order;
// written, or added to dxi with `accumulate`.
void rmsnorm_backward_row(const float* gi, const float* xi, const float* wp, float r, int64_t f, float* dxi,
                          bool accumulate) {
  // mean(ĝ ⊙ x̂) = r·mean(dy ⊙ w ⊙ x)
  float lane[16] = {};
  int64_t j = 0;
  for (; j + 16 <= f; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] += gi[j + l] * wp[j + l] * xi[j + l];
  float s = 0;
  for (; j < f; ++j) s += gi[j] * wp[j] * xi[j];
  for (int l = 0; l < 16; ++l) s += lane[l];
  const float mean_gx = s * r / static_cast<float>(f);
  for (j = 0; j < f; ++j) {
    const float d = r * (gi[j] * wp[j] - xi[j] * r * mean_gx);
    dxi[j] = accumulate ? dxi[j] + d : d;
  }
}

}  // namespace

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, bool accumulate_dx) {
  int64_t f = last_dim(x), n = rows_of(x);
  const float* xp = x.data<float>();
  const float* gp = dy.data<float>();
  const float* wp = w.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  if (!dw.defined()) {
    if (!dxp) return;
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i)
      rmsnorm_backward_row(gp + i * f, xp + i * f, wp, rp[i], f, dxp + i * f, accumulate_dx);
    return;
  }
  // One pass over x and dy for both gradients (the op is memory-bound): rows go in fixed chunks of
  // kNormRowChunk; each chunk writes its rows' dx and its own partial dw, and the partials are then
  // added in chunk order, column by column. The chunking depends only on n, so dw is bitwise the
  // same for any thread count.
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  thread_local std::vector<float> partial;  // kept between calls: no page faults per call
  partial.assign(static_cast<size_t>(chunks * f), 0.0f);
  float* const part = partial.data();  // the caller's buffer: a thread_local name would mean each worker's own
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    float* __restrict__ pw = part + c * f;
    const int64_t i1 = std::min(n, (c + 1) * kNormRowChunk);
    for (int64_t i = c * kNormRowChunk; i < i1; ++i) {
      const float* __restrict__ gi = gp + i * f;
      const float* __restrict__ xi = xp + i * f;
      const float r = rp[i];
      if (dxp) rmsnorm_backward_row(gi, xi, wp, r, f, dxp + i * f, accumulate_dx);
      for (int64_t j = 0; j < f; ++j) pw[j] += gi[j] * (xi[j] * r);  // dw += dy ⊙ x̂
    }
  }
  column_reduce(chunks, f, dw.data<float>(), [&](int64_t c, int64_t j) { return part[c * f + j]; });
}

// ---------------------------------------------------------------------------------------------
// residual scaling: y = (h + b_h) ⊙ s_h + (x + b_x) ⊙ s_x.
// backward: dh = dy ⊙ s_h, dx = dy ⊙ s_x, ds_h += Σ dy ⊙ (h + b_h), db_h += Σ dy ⊙ s_h,
//           ds_x += Σ dy ⊙ (x + b_x), db_x += Σ dy ⊙ s_x.

namespace {

// h's element as f32: itself, or a bf16 copy widened (exact).
inline float h_value(float v) { return v; }
inline float h_value(bf16 v) { return to_float(v); }

// One row of residual_scale_backward: dh, dx (when wanted) and the row's terms of the three column
// sums. Restrict-qualified parameters, so that every loop vectorizes. HT is h's element type: the
// widened bf16 value enters the same expression as an f32 one, so the sums are bitwise the f32
// op's on the widened h.
template <class HT>
void residual_scale_backward_row(const float* __restrict__ gi, const HT* __restrict__ hi,
                                 const float* __restrict__ xi, const float* __restrict__ sh,
                                 const float* __restrict__ bh, const float* __restrict__ sx,
                                 const float* __restrict__ bx, int64_t f, float* __restrict__ dhi,
                                 float* __restrict__ dxi, float* __restrict__ p_sh, float* __restrict__ p_sx,
                                 float* __restrict__ p_g) {
  if (dhi)
    for (int64_t j = 0; j < f; ++j) dhi[j] = gi[j] * sh[j];
  if (dxi)
    for (int64_t j = 0; j < f; ++j) dxi[j] = gi[j] * sx[j];
  for (int64_t j = 0; j < f; ++j) {
    p_sh[j] += gi[j] * (h_value(hi[j]) + bh[j]);
    p_sx[j] += gi[j] * (xi[j] + bx[j]);
    p_g[j] += gi[j];
  }
}
}  // namespace

void residual_scale_forward(const Tensor& y, const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  int64_t f = last_dim(h), n = rows_of(h);
  const float *hp = h.data<float>(), *xp = x.data<float>();
  const float *sh = p.hidden_scale.data<float>(), *bh = p.hidden_bias.data<float>();
  const float *sx = p.residual_scale.data<float>(), *bx = p.residual_bias.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      int64_t k = i * f + j;
      yp[k] = (hp[k] + bh[j]) * sh[j] + (xp[k] + bx[j]) * sx[j];
    }
}

namespace {
template <class HT>
void residual_scale_backward_impl(const Tensor& dh, const Tensor& dx, const ResidualScaleParams& grads,
                                  const Tensor& dy, const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  int64_t f = last_dim(h), n = rows_of(h);
  const HT* hp = h.data<HT>();
  const float *xp = x.data<float>(), *gp = dy.data<float>();
  const float *sh = p.hidden_scale.data<float>(), *bh = p.hidden_bias.data<float>();
  const float *sx = p.residual_scale.data<float>(), *bx = p.residual_bias.data<float>();
  float* dhp = dh.defined() ? dh.data<float>() : nullptr;
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  // One pass over dy, h and x (the op is memory-bound) writes dh and dx and three column sums per
  // chunk of kNormRowChunk rows: Σ dy ⊙ (h + b_h), Σ dy ⊙ (x + b_x) and Σ dy. The chunks' partials
  // are then added in chunk order, so the parameter gradients do not depend on the thread count.
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  thread_local std::vector<float> partial;  // kept between calls: no page faults per call
  partial.assign(static_cast<size_t>(chunks * 3 * f), 0.0f);
  float* const part = partial.data();  // the caller's buffer (each worker's thread_local is its own)
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    float* p_sh = part + c * 3 * f;
    float* p_sx = p_sh + f;
    float* p_g = p_sx + f;
    for (int64_t i = c * kNormRowChunk; i < std::min(n, (c + 1) * kNormRowChunk); ++i)
      residual_scale_backward_row(gp + i * f, hp + i * f, xp + i * f, sh, bh, sx, bx, f, dhp ? dhp + i * f : nullptr,
                                  dxp ? dxp + i * f : nullptr, p_sh, p_sx, p_g);
  }
  float *dsh = grads.hidden_scale.data<float>(), *dbh = grads.hidden_bias.data<float>();
  float *dsx = grads.residual_scale.data<float>(), *dbx = grads.residual_bias.data<float>();
  std::vector<float> sums(static_cast<size_t>(3 * f), 0.0f);  // [Σ dy ⊙ (h + b_h) | Σ dy ⊙ (x + b_x) | Σ dy]
  column_reduce(chunks, 3 * f, sums.data(), [&](int64_t c, int64_t j) { return part[c * 3 * f + j]; });
  for (int64_t j = 0; j < f; ++j) {
    dsh[j] += sums[j];
    dsx[j] += sums[f + j];
    dbh[j] += sums[2 * f + j] * sh[j];  // Σ dy ⊙ s_h = s_h · Σ dy
    dbx[j] += sums[2 * f + j] * sx[j];
  }
}
}  // namespace

void residual_scale_backward(const Tensor& dh, const Tensor& dx, const ResidualScaleParams& grads, const Tensor& dy,
                             const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  if (h.dtype() == DType::bf16)
    residual_scale_backward_impl<bf16>(dh, dx, grads, dy, h, x, p);
  else
    residual_scale_backward_impl<float>(dh, dx, grads, dy, h, x, p);
}

// ---------------------------------------------------------------------------------------------
// activations. silu(x) = x·σ(x), silu'(x) = σ(x)·(1 + x·(1 − σ(x))).
// gelu(x) = ½x(1 + erf(x/√2)), gelu'(x) = ½(1 + erf(x/√2)) + x·φ(x), φ the standard normal pdf;
// erf is cpu::erf_fast (≤ ~1 ulp, seq_vec.h), exp is cpu::expf_fast.

namespace {
// Below kTail, σ(x) < 1.9e-35 and φ(x) < 1e-35 (for x² > 2·80) are taken as exactly 0, and their
// arguments are clamped to it first, so no lane computes a subnormal on the way: 1/(1 + e^{-x})
// with x < −88 (expf_fast saturates at ~1.7e38) came out below float's normal range, and x86 runs
// such operations through microcode assists. SwiGLU with gate pre-activations near −100 (a token
// with a massive activation in one channel) ran 10× slower forward and 12× backward, GELU's
// backward at −30 ~6× (docs/results/ops-cpu.md, "Activations: subnormal tails"). The constants are
// the ones the CUDA kernels use (ops/elementwise_math.h), so both devices cut the tails alike.
using math::kTail;
// expf_fast (vectorizable; libm's expf is a scalar call) — SwiGLU runs over every expert row.
inline float sigmoid(float x) {
  const float s = 1.0f / (1.0f + cpu::expf_fast(-std::max(x, kTail)));
  return x < kTail ? 0.0f : s;
}
inline float silu_grad(float x) {
  float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}
#if ZAYA_AVX2
// sigmoid and silu_grad on 8 lanes, the scalar forms' operations (GCC does not vectorize the plain
// loops below on AVX2: the clamp in expf_fast stays a branch there).
inline __m256 sigmoid_v8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f), tail = _mm256_set1_ps(kTail);
  // max(tail, x) is std::max(x, kTail): x where x is NaN (the second operand wins).
  const __m256 xm = _mm256_max_ps(tail, x);
  const __m256 s =
      _mm256_div_ps(one, _mm256_add_ps(one, cpu::expf_fast_v8(_mm256_sub_ps(_mm256_setzero_ps(), xm))));
  return _mm256_blendv_ps(s, _mm256_setzero_ps(), _mm256_cmp_ps(x, tail, _CMP_LT_OQ));
}
// s·(1 + x·(1 − s)) with the inner product-sum as one FMA, as GCC contracts the scalar form.
inline __m256 silu_grad_v8(__m256 x, __m256 s) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
}
#endif
using math::kInvSqrt2;
using math::kInvSqrt2Pi;

// Applies out[i] = f(i) over n elements. Threads take fixed chunks; each chunk is a plain counted
// loop over an inlined f, which the compiler vectorizes (f must be branch-free: expf_fast/erf_fast,
// no libm calls).
constexpr int64_t kElemChunk = 8192;

// An optional f8(i) does elements i..i+7 at once (explicit 8-lane code where the compiler leaves
// f scalar); f then takes each chunk's last n mod 8.
template <class F, class... F8>
void elementwise(int64_t n, F f, F8... f8) {
  static_assert(sizeof...(F8) <= 1);
  int64_t chunks = (n + kElemChunk - 1) / kElemChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t i = c * kElemChunk, i1 = std::min(n, (c + 1) * kElemChunk);
    if constexpr (sizeof...(F8) == 1)
      for (; i + 8 <= i1; i += 8) (f8(i), ...);
    for (; i < i1; ++i) f(i);
  }
}
}  // namespace

void cast_to_bf16(const Tensor& dst, const Tensor& src) {
  const float* a = src.data<float>();
  bf16* b = dst.data<bf16>();
  const int64_t n = src.numel();
#if defined(__AVX512BF16__)
  // 16 floats per conversion instruction, where GCC's loop over to_bf16 was a visible share of
  // Muon's Newton–Schulz in a profile. The instruction rounds to nearest even and quiets NaNs as
  // to_bf16 does, but reads subnormal inputs as zero, so a block holding one (never the case for
  // the weights and iterates this casts) takes to_bf16 element by element: the same bits always.
  const int64_t blocks = n / 16;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t k = 0; k < blocks; ++k) {
    const __m512 x = _mm512_loadu_ps(a + 16 * k);
    const __m512 mag =
        _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
    const __mmask16 sub = _mm512_cmp_ps_mask(mag, _mm512_set1_ps(FLT_MIN), _CMP_LT_OQ) &
                          _mm512_cmp_ps_mask(mag, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    if (sub == 0) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 16 * k), (__m256i)_mm512_cvtneps_pbh(x));
    } else {
      for (int64_t i = 16 * k; i < 16 * k + 16; ++i) b[i] = to_bf16(a[i]);
    }
  }
  for (int64_t i = 16 * blocks; i < n; ++i) b[i] = to_bf16(a[i]);
#else
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) b[i] = to_bf16(a[i]);
#endif
}

// Widening is a shift of each element's bits (to_float): exact, and vectorized by the compiler.
void cast_to_f32(const Tensor& dst, const Tensor& src) {
  const bf16* a = src.data<bf16>();
  float* b = dst.data<float>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) b[i] = to_float(a[i]);
}

void silu_forward(const Tensor& y, const Tensor& x) {
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  auto f = [&](int64_t i) { yp[i] = xp[i] * sigmoid(xp[i]); };
#if ZAYA_AVX2
  elementwise(x.numel(), f, [&](int64_t i) {
    const __m256 v = _mm256_loadu_ps(xp + i);
    _mm256_storeu_ps(yp + i, _mm256_mul_ps(v, sigmoid_v8(v)));
  });
#else
  elementwise(x.numel(), f);
#endif
}

void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const float *xp = x.data<float>(), *gp = dy.data<float>();
  float* dp = dx.data<float>();
  auto f = [&](int64_t i) { dp[i] = gp[i] * silu_grad(xp[i]); };
#if ZAYA_AVX2
  elementwise(x.numel(), f, [&](int64_t i) {
    const __m256 v = _mm256_loadu_ps(xp + i);
    _mm256_storeu_ps(dp + i, _mm256_mul_ps(_mm256_loadu_ps(gp + i), silu_grad_v8(v, sigmoid_v8(v))));
  });
#else
  elementwise(x.numel(), f);
#endif
}

// GELU runs erf over kGeluBlock elements at a time through cpu::erf_fast_n (its table lookups are
// AVX-512 permutes, which the compiler would not produce from a per-element call), in a buffer
// between two vectorized loops. The block is small (512 B) so that reading x from memory stays
// interleaved with the arithmetic (the hardware prefetcher runs ahead of it). Beyond the caches on
// the development VM, GELU forward ran at 63-69% of the STREAM triad with 128-element blocks, 55-63%
// with 512, 48% with 2048 and below the old per-element loop's 48% with 8192.
constexpr int64_t kGeluBlock = 128;

// Calls f(i0, len, x + i0, e) for consecutive blocks of x's n elements, e[i] = erf(x[i0 + i]/√2);
// threads take fixed kElemChunk chunks.
template <class F>
void for_gelu_blocks(const float* xp, int64_t n, F f) {
  const int64_t chunks = (n + kElemChunk - 1) / kElemChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    float e[kGeluBlock];
    const int64_t c1 = std::min(n, (c + 1) * kElemChunk);
    for (int64_t i0 = c * kElemChunk; i0 < c1; i0 += kGeluBlock) {
      const int64_t len = std::min(c1 - i0, kGeluBlock);
      const float* xb = xp + i0;
      for (int64_t i = 0; i < len; ++i) e[i] = xb[i] * kInvSqrt2;
      cpu::erf_fast_n(e, e, len);
      f(i0, len, xb, static_cast<const float*>(e));
    }
  }
}

void gelu_forward(const Tensor& y, const Tensor& x) {
  float* yp = y.data<float>();
  for_gelu_blocks(x.data<float>(), x.numel(), [&](int64_t i0, int64_t len, const float* xb, const float* e) {
    for (int64_t i = 0; i < len; ++i) yp[i0 + i] = 0.5f * xb[i] * (1.0f + e[i]);
  });
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const float* gp = dy.data<float>();
  float* dp = dx.data<float>();
  for_gelu_blocks(x.data<float>(), x.numel(), [&](int64_t i0, int64_t len, const float* xb, const float* e) {
    for (int64_t i = 0; i < len; ++i) {
      const float v = xb[i];
      const float cdf = 0.5f * (1.0f + e[i]);
      const float a = -0.5f * v * v;  // φ(v) = e^a/√(2π), 0 below kTail (see sigmoid)
      const float pdf = a < kTail ? 0.0f : kInvSqrt2Pi * cpu::expf_fast(std::max(a, kTail));
      dp[i0 + i] = gp[i0 + i] * (cdf + v * pdf);
    }
  });
}

// swiglu: y = silu(g) ⊙ v.  dg = dy ⊙ v ⊙ silu'(g),  dv = dy ⊙ silu(g).

void swiglu_forward(const Tensor& y, const Tensor& gu) {
  int64_t n = gu.size(0), inter = gu.size(1) / 2;
  const float* p = gu.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* g = p + i * 2 * inter;
    const float* v = g + inter;
    float* y = yp + i * inter;
    int64_t j = 0;
#if ZAYA_AVX2
    for (; j + 8 <= inter; j += 8) {
      const __m256 gv = _mm256_loadu_ps(g + j);
      _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid_v8(gv)), _mm256_loadu_ps(v + j)));
    }
#endif
    for (; j < inter; ++j) y[j] = g[j] * sigmoid(g[j]) * v[j];
  }
}

namespace {
void swiglu_backward_f32(const Tensor& dgu, const Tensor& dy, const Tensor& gu);
}  // namespace

// gu in bf16 (the saved copy of bf16 activations): blocks of rows widened exactly into the
// calling thread's f32 buffer, then the f32 loop on them, so the result is the f32 op's bits on the
// widened gu. The loop is compiled once on purpose: a second copy reading bf16 directly came out of
// GCC with other contractions and gave other bits. 256 rows a block: 4 MiB of buffer at ZAYA1-base's
// I = 2048, kept from call to call.
void swiglu_backward(const Tensor& dgu, const Tensor& dy, const Tensor& gu) {
  if (gu.dtype() != DType::bf16) return swiglu_backward_f32(dgu, dy, gu);
  constexpr int64_t kRows = 256;
  const int64_t n = gu.size(0), cols = gu.size(1);
  thread_local AlignedVector<float> wide;
  const size_t need = static_cast<size_t>(std::min(n, kRows) * cols);
  if (wide.size() < need) wide.resize(need);
  for (int64_t r0 = 0; r0 < n; r0 += kRows) {
    const int64_t r1 = std::min(n, r0 + kRows);
    const Tensor block = Tensor::borrow(wide.data(), Shape{r1 - r0, cols}, DType::f32);
    cast_to_f32(block, gu.slice(r0, r1));
    swiglu_backward_f32(dgu.slice(r0, r1), dy.slice(r0, r1), block);
  }
}

namespace {
void swiglu_backward_f32(const Tensor& dgu, const Tensor& dy, const Tensor& gu) {
  int64_t n = gu.size(0), inter = gu.size(1) / 2;
  const float *p = gu.data<float>(), *gp = dy.data<float>();
  float* dp = dgu.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* g = p + i * 2 * inter;
    const float* v = g + inter;
    const float* d = gp + i * inter;
    float* dg = dp + i * 2 * inter;
    float* dv = dg + inter;
    int64_t j = 0;
#if ZAYA_AVX2
    for (; j + 8 <= inter; j += 8) {
      const __m256 gv = _mm256_loadu_ps(g + j), dj = _mm256_loadu_ps(d + j), s = sigmoid_v8(gv);
      _mm256_storeu_ps(dv + j, _mm256_mul_ps(_mm256_mul_ps(dj, gv), s));
      _mm256_storeu_ps(dg + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(dj, _mm256_loadu_ps(v + j)), s),
                                             _mm256_fmadd_ps(gv, _mm256_sub_ps(_mm256_set1_ps(1.0f), s), _mm256_set1_ps(1.0f))));
    }
#endif
    for (; j < inter; ++j) {
      float s = sigmoid(g[j]);
      dv[j] = d[j] * g[j] * s;
      dg[j] = d[j] * v[j] * s * (1.0f + g[j] * (1.0f - s));
    }
  }
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// softmax over the last dim: y = exp(x − max) / Σ exp(x − max), exp by cpu::expf_fast (~1 ulp).
// dx = y ⊙ (dy − Σ dy ⊙ y).

namespace {

// dst[j] = s·src[j] with non-temporal stores where the ISA has them: a plain store first reads each
// line it writes (the write-allocate), a third of the traffic of a streaming op. The values are the
// same products either way. The caller fences (_mm_sfence) before other threads read dst.
void scaled_copy_streaming(float* dst, const float* src, float s, int64_t n) {
  int64_t j = 0;
#if defined(__AVX512F__)
  for (; j < n && (reinterpret_cast<uintptr_t>(dst + j) & 63) != 0; ++j) dst[j] = src[j] * s;
  const __m512 vs = _mm512_set1_ps(s);
  for (; j + 16 <= n; j += 16) _mm512_stream_ps(dst + j, _mm512_mul_ps(_mm512_loadu_ps(src + j), vs));
#endif
  for (; j < n; ++j) dst[j] = src[j] * s;
}

}  // namespace

void softmax_forward(const Tensor& y, const Tensor& x, StoreMode mode) {
  int64_t f = last_dim(x), n = rows_of(x);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  if (mode == StoreMode::automatic)
    mode = static_cast<int64_t>(y.nbytes()) > cpu_cache_bytes() ? StoreMode::streaming : StoreMode::cached;
  if (mode == StoreMode::cached) {  // y stays in cache for its reader
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = xp + i * f;
      float* yi = yp + i * f;
      const float inv = 1.0f / cpu::exp_store_sum(yi, xi, f, cpu::maxf(xi, f), i + 1 < n ? xi + f : nullptr);
      for (int64_t j = 0; j < f; ++j) yi[j] *= inv;
    }
    return;
  }
  // Larger than the caches: the exps go to a per-thread row buffer (L1/L2) and y is written once,
  // with streaming stores. Same values as above.
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(f));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = xp + i * f;
      const float inv = 1.0f / cpu::exp_store_sum(row.data(), xi, f, cpu::maxf(xi, f), i + 1 < n ? xi + f : nullptr);
      scaled_copy_streaming(yp + i * f, row.data(), inv, f);
    }
#if defined(__AVX512F__)
    _mm_sfence();  // the streaming stores are visible before the loop's closing barrier
#endif
  }
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  int64_t f = last_dim(y), n = rows_of(y);
  const float *yp = y.data<float>(), *gp = dy.data<float>();
  float* dp = dx.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float s = dot_fixed(gp + i * f, yp + i * f, f);
    for (int64_t j = 0; j < f; ++j) dp[i * f + j] = yp[i * f + j] * (gp[i * f + j] - s);
  }
}

}  // namespace zaya::ops::cpu
