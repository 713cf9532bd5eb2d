// Tiled causal GQA attention on the CPU (the math and the contract are in zaya/ops/attention.h).
//
// Layout: q [B, T, nq, hd], k/v [B, T, nkv, hd]; row i of head h is at ((b·T + i)·nq + h)·hd.
// Per tile, the key (and value) block is transposed into Kt[d][j]; every tile product (Q·Kᵀ, P·V
// and the backward's five) then runs through one register-blocked kernel, mm(), whose B operand
// has contiguous rows. Plain per-row AXPY loops ran at ~20-28 GFLOP/s, bound by reloading and
// storing the score row once per d.
#include "zaya/ops/cpu/attention_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/cpu/tile_mm.h"

namespace zaya::ops::cpu {

namespace {

constexpr int64_t kBlock = 64;  // queries and keys per tile: Kt and Vt (2·64·hd floats) stay in L1/L2
static_assert(kBlock == attention_tiled_block);
// Keys per softmax pass of the forward: its Kᵀ (hd·512 floats) and scores (64·512) stay in L2.
constexpr int64_t kChunk = 8 * kBlock;
// Row stride of the forward's Kᵀ and S scratch: a chunk plus one cache line. At exactly kChunk
// (2 KiB) the hd rows of a Kᵀ panel fall into a few L1 sets and evict each other while the row
// blocks of Q pass over the panel.
constexpr int64_t kChunkLd = kChunk + 16;

// Probabilities below kTinyProbability are stored as exactly 0 (`flush`), as the loss does with its
// softmax. Peaky attention (a row's scores spread over more than ~70) otherwise gives values near
// float's smallest normal (expf_fast floors at ~1.6e-38), and their products with values and
// gradients in the tile products fall below the normal range, which x86 runs through microcode
// assists: at the demo's shape, q scaled ×30 made the backward ~12× slower and ×100 the forward
// ~10× and the backward ~30× (bench_ops_attention's q-scale arg; docs/results/ops-cpu.md,
// "Attention: denormals"). A dropped term is < 2^-100 of the row's largest, far below float's
// resolution of the sums it would enter.
constexpr FlushBelow flush{kTinyProbability};

// exp over an array (arguments here are ≤ 0: scores minus their running max or minus the lse),
// flushed.
inline void exp_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = flush(expf_fast(x[i]));
}

// Copies the key (or value) block rows j0..j0+nj of kv head hk ([T, nkv, hd] for one batch row)
// into Xt[d][j] (ld ldt) and X[j][d] (ld hd), both zero-padded to kBlock keys so the tile products
// can always run over 64 keys (padded keys get P = 0).
inline void load_block(float* Xt, int64_t ldt, float* X, const float* src, int64_t j0, int64_t nj, int64_t nkv,
                       int64_t hk, int64_t hd) {
#if defined(__AVX512F__)
  if (nj == kBlock && hd % 16 == 0) {  // whole 16×16 squares: transposed in registers
    for (int64_t j = 0; j < kBlock; j += 16)
      for (int64_t d = 0; d < hd; d += 16) {
        const float* rows = src + ((j0 + j) * nkv + hk) * hd + d;
        transpose16(Xt + d * ldt + j, ldt, rows, nkv * hd);
        if (X)
          for (int64_t r = 0; r < 16; ++r) std::copy_n(rows + r * nkv * hd, 16, X + (j + r) * hd + d);
      }
    return;
  }
#elif ZAYA_AVX2
  if (nj == kBlock && hd % 8 == 0) {  // whole 8×8 squares: transposed in registers
    for (int64_t j = 0; j < kBlock; j += 8)
      for (int64_t d = 0; d < hd; d += 8) {
        const float* rows = src + ((j0 + j) * nkv + hk) * hd + d;
        transpose8(Xt + d * ldt + j, ldt, rows, nkv * hd);
        if (X)
          for (int64_t r = 0; r < 8; ++r) std::copy_n(rows + r * nkv * hd, 8, X + (j + r) * hd + d);
      }
    return;
  }
#endif
  for (int64_t j = 0; j < kBlock; ++j) {
    const float* row = src + ((j0 + j) * nkv + hk) * hd;
    for (int64_t d = 0; d < hd; ++d) {
      const float x = j < nj ? row[d] : 0.0f;
      Xt[d * ldt + j] = x;
      if (X) X[j * hd + d] = x;
    }
  }
}

// rows × cols floats from src (rows ld apart) to dense dst. At hd = 64 in vector registers, two rows
// at a time: a memmove call per 64-float row had 7% of the attention backward's samples at the
// demo's shapes.
inline void copy_rows(float* dst, const float* src, int64_t rows, int64_t ld, int64_t cols) {
#if defined(__AVX512F__)
  if (cols == 64) {  // two rows' 8 loads before their 8 stores
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
      __m512 x[8];
      for (int k = 0; k < 8; ++k) x[k] = _mm512_loadu_ps(src + (r + k / 4) * ld + 16 * (k % 4));
      for (int k = 0; k < 8; ++k) _mm512_storeu_ps(dst + (r + k / 4) * cols + 16 * (k % 4), x[k]);
    }
    if (r < rows) std::copy_n(src + r * ld, cols, dst + r * cols);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * ld, cols, dst + r * cols);
}

// y = s·x, restrict-qualified so it vectorizes without a runtime overlap check (as a loop over
// out's rows, perf put ~15% of the one-thread forward's samples on the stack spills right after
// it; the A/B: 1.03× on one thread, 1.01× on two, bench_ops_attention, 8 alternations).
inline void scale_row(float* __restrict y, const float* __restrict x, float s, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] = x[d] * s;
}

// P[ii][j] = exp(scale·S[ii][j] − L_i) for the causal, in-range keys of a tile and exactly 0 for the
// others (masked or padded), so they add nothing to any product. lse_blk holds the tile's rows'
// logsumexp; off = the tile's first query position − its first key position (row ii sees keys
// j ≤ off + ii).
inline void probs(float* P, const float* lse_blk, int64_t off, int64_t ni, int64_t nj, float scale) {
#if defined(__AVX512F__)
  static_assert(kBlock == 64);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t ii = 0; ii < ni; ++ii) {  // 4 masked vectors per row: no scalar tails on diagonal tiles
    float* p = P + ii * kBlock;
    const int64_t jn = std::min(nj, off + ii + 1);
    const __m512 L = _mm512_set1_ps(lse_blk[ii]);
    for (int64_t v = 0; v < 4; ++v) {
      const __mmask16 mk = first_lanes(jn - 16 * v);
      const __m512 e = expf_fast_v(_mm512_fmsub_ps(_mm512_loadu_ps(p + 16 * v), sc, L));
      _mm512_storeu_ps(p + 16 * v, _mm512_maskz_mov_ps(mk, apply_post(flush, e)));
    }
  }
#elif ZAYA_AVX2
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t ii = 0; ii < ni; ++ii) {  // 8 masked vectors per row, as the AVX-512 form's 4
    float* p = P + ii * kBlock;
    const int64_t jn = std::min(nj, off + ii + 1);
    const __m256 L = _mm256_set1_ps(lse_blk[ii]);
    for (int64_t v = 0; v < kBlock / 8; ++v) {
      const __m256 keep = _mm256_castsi256_ps(first_lanes8(jn - 8 * v));
      const __m256 x = _mm256_fmsub_ps(_mm256_loadu_ps(p + 8 * v), sc, L);
      _mm256_storeu_ps(p + 8 * v, _mm256_and_ps(keep, apply_post(flush, expf_fast_v8(x))));
    }
  }
#else
  for (int64_t ii = 0; ii < ni; ++ii) {
    float* p = P + ii * kBlock;
    const int64_t jn = std::min(nj, off + ii + 1);
    const float L = lse_blk[ii];
    for (int64_t j = 0; j < jn; ++j) p[j] = std::fma(p[j], scale, -L);  // one rounding, as the AVX-512 fmsub
    exp_inplace(p, jn);
    for (int64_t j = jn; j < kBlock; ++j) p[j] = 0.0f;
  }
#endif
}

// One row's softmax over its jn visible keys of a chunk, in place: s[j] becomes
// exp(scale·s[j] − mx) with mx = max(m_old, max_j scale·s[j]), and the entries past jn become 0 up
// to the next multiple of 16 at or past jn + kMaxRowBlock − 1 (the causal P·V product reads them:
// tile_mm's k_le_row runs a row block of up to kMaxRowBlock rows up to its last row's key; the
// extra entries are masked out of the max and add +0 to the sum, so the bits do not change).
// Returns mx; *sum receives Σ_j s[j] (16 lanes, sum16's tree).
inline float row_softmax(float* s, int64_t jn, float scale, float m_old, float* sum) {
#if defined(__AVX512F__)
  const __m512 sc = _mm512_set1_ps(scale);
  const int64_t nv = (jn + 15) / 16;
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 mk = first_lanes(jn - 16 * v);
    const __m512 x = _mm512_maskz_mul_ps(mk, _mm512_loadu_ps(s + 16 * v), sc);
    _mm512_storeu_ps(s + 16 * v, x);
    vmax = _mm512_mask_max_ps(vmax, mk, vmax, x);
  }
  float lane[16];
  _mm512_storeu_ps(lane, vmax);
  const float mx = std::max(m_old, *std::max_element(lane, lane + 16));
  const __m512 mv = _mm512_set1_ps(mx);
  __m512 lanes = _mm512_setzero_ps();
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 mk = first_lanes(jn - 16 * v);
    const __m512 e = _mm512_maskz_mov_ps(
        mk, apply_post(flush, expf_fast_v(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * v), mv))));
    _mm512_storeu_ps(s + 16 * v, e);
    lanes = _mm512_add_ps(lanes, e);
  }
  _mm512_storeu_ps(lane, lanes);
  *sum = sum16(lane);
  return mx;
#elif ZAYA_AVX2
  // The AVX-512 form on pairs of 8-lane vectors: lo holds lanes 0-7 of each 16, hi lanes 8-15, so
  // every lane sums the same terms in the same order and sum16 gives the same bits.
  const __m256 sc = _mm256_set1_ps(scale);
  const int64_t nv = 2 * ((jn + kMaxRowBlock - 1 + 15) / 16);  // 8-lane vectors (see above)
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int64_t v = 0; v < nv; ++v) {
    const __m256 keep = _mm256_castsi256_ps(first_lanes8(jn - 8 * v));
    const __m256 x = _mm256_and_ps(keep, _mm256_mul_ps(_mm256_loadu_ps(s + 8 * v), sc));
    _mm256_storeu_ps(s + 8 * v, x);
    vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, x), keep);
  }
  float lane[16];
  _mm256_storeu_ps(lane, vmax);
  const float mx = std::max(m_old, *std::max_element(lane, lane + 8));
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 lanes[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t v = 0; v < nv; ++v) {
    const __m256 keep = _mm256_castsi256_ps(first_lanes8(jn - 8 * v));
    const __m256 e =
        _mm256_and_ps(keep, apply_post(flush, expf_fast_v8(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * v), mv))));
    _mm256_storeu_ps(s + 8 * v, e);
    lanes[v % 2] = _mm256_add_ps(lanes[v % 2], e);
  }
  _mm256_storeu_ps(lane, lanes[0]);
  _mm256_storeu_ps(lane + 8, lanes[1]);
  *sum = sum16(lane);
  return mx;
#else
  for (int64_t j = 0; j < jn; ++j) s[j] *= scale;
  const float mx = std::max(m_old, maxf(s, jn));  // 16 lanes: a scalar max chain does not vectorize
  *sum = exp_store_sum(s, s, jn, mx, nullptr, flush);
  std::fill(s + jn, s + (jn + 15) / 16 * 16, 0.0f);
  return mx;
#endif
}

}  // namespace

// Forward, one task per (batch row, query head, query block of 64). The task's keys go in chunks
// of up to kChunk: S = Q·Kᵀ for the whole chunk at once, then each row's softmax over the chunk in
// one pass, then acc (+)= P·V as one product over the chunk's keys. Only a sequence longer than a
// chunk merges chunks online (running max m, sum l, acc rescaled when the max moves); at the demo's
// T = 256 there is one chunk, so no rescaling and one long product instead of four short ones.
// The diagonal key block (keys i0 .. i0+ni, always the chunk's last) computes only keys j ≤ i.
void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                   int64_t nq, int64_t nkv, int64_t hd) {
  attention_tiled_fwd(out, lse, q, k, v, B, T, T, 0, nq, nkv, hd);
}

// The forward for Tq queries at global positions q_pos + i (q_pos a multiple of kBlock, so every
// query block's diagonal is a key block) against keys [0, q_pos + Tq) of Tk per batch row; i0 is a
// query block's row in q and out, g0 = q_pos + i0 its position among the keys. At q_pos = 0,
// Tq = Tk the two are one, and this is attention_fwd bit for bit.
void attention_tiled_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B,
                         int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd,
                         int64_t key_end) {
  if (key_end < 0) key_end = q_pos + Tq;
  const int64_t G = nq / nkv, nblk = (Tq + kBlock - 1) / kBlock, rq = nq * hd, rk = nkv * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    float* Kt = scratch<6>(hd * kChunkLd);
    float* S = scratch<7>(kBlock * kChunkLd);
    AlignedVector<float> acc(kBlock * hd), m(kBlock), l(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nq * nblk; ++task) {
      // Largest query blocks first (most keys), for balance under the dynamic schedule.
      const int64_t qb = nblk - 1 - task % nblk, h = (task / nblk) % nq, b = task / (nblk * nq);
      const int64_t hk = h / G, i0 = qb * kBlock, ni = std::min(kBlock, Tq - i0), g0 = q_pos + i0;
      const float* kb_ = k + b * Tk * rk;
      const float* vb_ = v + (b * Tk * nkv + hk) * hd;  // value row j at vb_ + j·rk
      const float* qblk = q + ((b * Tq + i0) * nq + h) * hd;
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      const int64_t kend = std::min(g0 + ni, key_end);  // the keys this block sees
      for (int64_t c0 = 0; c0 < kend; c0 += kChunk) {
        const int64_t nk = std::min(kChunk, kend - c0);  // keys in this chunk
        const int64_t nfull = std::min(nk, g0 - c0);        // of them before the diagonal block
        for (int64_t j = 0; j < nk; j += kBlock)
          load_block(Kt + j, kChunkLd, nullptr, kb_, c0 + j, std::min(kBlock, nk - j), nkv, hk, hd);
        // S = Q·Kᵀ: the keys before the diagonal in full, the diagonal block's keys j ≤ i only.
        if (nfull > 0) mm(S, kChunkLd, qblk, rq, 1, Kt, kChunkLd, ni, nfull, hd, false);
        if (nk > nfull)
          mm(S + nfull, kChunkLd, qblk, rq, 1, Kt + nfull, kChunkLd, ni, nk - nfull, hd, false,
             Causal::cols_le_row);
        for (int64_t ii = 0; ii < ni; ++ii) {
          const int64_t jn = std::min(nk, g0 + ii - c0 + 1);  // causal: keys j ≤ i
          float sum;
          const float mx = row_softmax(S + ii * kChunkLd, jn, scale, m[ii], &sum);
          const float alpha = std::exp(m[ii] - mx);  // exp(−inf) = 0 on the first chunk
          m[ii] = mx;
          l[ii] = l[ii] * alpha + sum;
          if (c0 > 0 && alpha != 1.0f) {  // the first chunk writes acc afresh; an unmoved max keeps it
            float* a = acc.data() + ii * hd;
            for (int64_t d = 0; d < hd; ++d) a[d] *= alpha;
          }
        }
        // acc (+)= P·V over the chunk's keys, the diagonal block's terms k ≤ i only. The keys before
        // the diagonal go 64 at a time, so the value rows a product streams (64·hd floats, 16 KiB at
        // hd 64) stay in L1 while its 16 row blocks pass; as one product over up to 192 keys they
        // came from L2 (48 KiB), at 1.05–1.08× the time of the forward (an in-process A/B of the two
        // forms alternated 30 times, three runs, 25–28 of 30 won). A product that accumulates into
        // acc continues each element's FMA chain in the same key order: the same bits.
        for (int64_t j = 0; j < nfull; j += kBlock)
          mm(acc.data(), hd, S + j, kChunkLd, 1, vb_ + (c0 + j) * rk, rk, ni, hd, std::min(kBlock, nfull - j),
             c0 > 0 || j > 0);
        if (nk > nfull)
          mm(acc.data(), hd, S + nfull, kChunkLd, 1, vb_ + (c0 + nfull) * rk, rk, ni, hd, nk - nfull,
             c0 > 0 || nfull > 0, Causal::k_le_row);
      }
      for (int64_t ii = 0; ii < ni; ++ii) {
        const int64_t i = i0 + ii;
        scale_row(out + ((b * Tq + i) * nq + h) * hd, acc.data() + ii * hd, 1.0f / l[ii], hd);
        lse[(b * nq + h) * Tq + i] = m[ii] + std::log(l[ii]);
      }
    }
  }
}

// Backward. With P_ij = exp(scale·q_i·k_j − lse_i) and D_i = ⟨dO_i, O_i⟩:
//   dV_j = Σ_i P_ij dO_i,  dP_ij = ⟨dO_i, V_j⟩,  dS_ij = P_ij (dP_ij − D_i),
//   dQ_i = scale Σ_j dS_ij K_j,  dK_j = scale Σ_i dS_ij Q_i.
// One task per (batch row, kv head) owns every gradient row it writes: dK and dV of its key blocks
// and dQ of its G query heads. It walks key blocks in order and, for each, the G heads' query
// blocks that see it, so each tile's P and dS are made once and feed all three products (5 tile
// products per tile: Q·Kᵀ, dO·Vᵀ, Pᵀ·dO, dSᵀ·Q, dS·K). dQ rows accumulate over the key blocks in
// order in place: every element is one FMA chain in a fixed order, so the result is bitwise the
// same for any thread count. The first product into each gradient row writes it instead of
// adding to a zero fill (the same bits: the chain starts from +0 either way). (B·nkv tasks: enough
// for the CPU's few threads at training shapes.) dS carries the factor scale.
void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                   const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t nq,
                   int64_t nkv, int64_t hd) {
  attention_tiled_bwd(dq, dk, dv, dout, q, k, v, out, lse, B, T, T, 0, nq, nkv, hd, /*accumulate_kv=*/false);
}

// The backward of attention_tiled_fwd: key blocks [0, q_pos + Tq), the query blocks at or after
// each; with accumulate_kv every dK, dV product adds (the chunks of a context-parallel rank add
// into one buffer), else the first writes as above. At q_pos = 0, Tq = Tk, !accumulate_kv this is
// attention_bwd bit for bit.
void attention_tiled_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                         const float* v, const float* out, const float* lse, int64_t B, int64_t Tq, int64_t Tk,
                         int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd, bool accumulate_kv,
                         int64_t key_end, bool accumulate_q) {
  const int64_t T = Tq;  // query rows: D, lse, dq, dout, out, q
  const int64_t G = nq / nkv, nblk = (T + kBlock - 1) / kBlock, rq = nq * hd, rk = nkv * hd;
  const int64_t kend = key_end < 0 ? q_pos + Tq : std::min(q_pos + Tq, key_end);  // the keys any query sees
  const int64_t nkb = (kend + kBlock - 1) / kBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // D [B, nq, T]: O(T) scratch, like lse.
  std::vector<float> D(static_cast<size_t>(B * nq * T));
#pragma omp parallel for schedule(static)
  for (int64_t bti = 0; bti < B * T; ++bti)
    for (int64_t h = 0; h < nq; ++h) {
      const int64_t off = (bti * nq + h) * hd, b = bti / T, i = bti % T;
      D[(b * nq + h) * T + i] = dotf(dout + off, out + off, hd);
    }

#pragma omp parallel
  {
    AlignedVector<float> Kt(hd * kBlock), Kb(kBlock * hd), Vt(hd * kBlock), P(kBlock * kBlock),
        dS(kBlock * kBlock), Qb(kBlock * hd), dOb(kBlock * hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nkv; ++task) {
      const int64_t hk = task % nkv, b = task / nkv;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBlock, nj = std::min(kBlock, kend - j0);
        load_block(Kt.data(), kBlock, Kb.data(), k + b * Tk * rk, j0, nj, nkv, hk, hd);
        load_block(Vt.data(), kBlock, nullptr, v + b * Tk * rk, j0, nj, nkv, hk, hd);
        // This block's dK and dV rows, written by their first product (head hk·G, the diagonal
        // tile, which reaches every row) and accumulated by the rest.
        float* dkb = dk + ((b * Tk + j0) * nkv + hk) * hd;
        float* dvb = dv + ((b * Tk + j0) * nkv + hk) * hd;
        for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
          const float* Lrow = lse + (b * nq + h) * T;
          const float* Drow = D.data() + (b * nq + h) * T;
          for (int64_t qb = std::max<int64_t>(0, (j0 - q_pos) / kBlock); qb < nblk; ++qb) {  // causal: queries i ≥ j0
            const int64_t i0 = qb * kBlock, ni = std::min(kBlock, T - i0), g0 = q_pos + i0;
            const int64_t row0 = (b * T + i0) * nq + h;
            // The tile's query and output-gradient rows, copied to contiguous [ni, hd] blocks: in
            // place their rows lie nq·hd floats apart (1 KiB at the demo's shapes), and as the B
            // operand of dV += Pᵀ·dO and dK += dSᵀ·Q such rows crowd a few L1 sets.
            copy_rows(Qb.data(), q + row0 * hd, ni, nq * hd, hd);
            copy_rows(dOb.data(), dout + row0 * hd, ni, nq * hd, hd);
            // On the diagonal tile (qb = kb) each product skips what the causal mask makes zero
            // or unused (Causal in tile_mm.h); scores past a row's last key are never computed.
            const bool diag = g0 == j0;
            const Causal cols = diag ? Causal::cols_le_row : Causal::none;
            mm(P.data(), kBlock, Qb.data(), hd, 1, Kt.data(), kBlock, ni, kBlock, hd, false, cols);
            probs(P.data(), Lrow + i0, g0 - j0, ni, nj, scale);
            mm(dS.data(), kBlock, dOb.data(), hd, 1, Vt.data(), kBlock, ni, kBlock, hd, false, cols);  // dP
            // dS = P ⊙ (dP − D)·scale in place of dP over each row's visible keys, 0 past them
            // (where dP may not have been computed).
            for (int64_t ii = 0; ii < ni; ++ii) {
              const float Di = Drow[i0 + ii];
              float* ds = dS.data() + ii * kBlock;
              const float* p = P.data() + ii * kBlock;
              const int64_t jn = std::min(nj, g0 + ii - j0 + 1);
              for (int64_t j = 0; j < jn; ++j) ds[j] = scale * p[j] * (ds[j] - Di);
              std::fill(ds + jn, ds + kBlock, 0.0f);
            }
            // dV += Pᵀ·dO and dK += dSᵀ·Q over this block's ni query rows (Aᵀ by stride swap).
            const Causal k_from = diag ? Causal::k_ge_row : Causal::none;
            const bool first = !accumulate_kv && h == hk * G && diag;
            mm(dvb, rk, P.data(), 1, kBlock, dOb.data(), hd, nj, hd, ni, !first, k_from);
            mm(dkb, rk, dS.data(), 1, kBlock, Qb.data(), hd, nj, hd, ni, !first, k_from);
            // dQ += dS·K; these dQ rows' first product is key block 0's, which writes them (unless
            // accumulate_q: the keys before a chunk add to the chunk's own keys' dQ).
            mm(dq + row0 * hd, rq, dS.data(), kBlock, 1, Kb.data(), hd, ni, hd, kBlock, kb > 0 || accumulate_q,
               diag ? Causal::k_le_row : Causal::none);
          }
        }
      }
    }
  }
}

void attention_decode(float* out, const float* q, const float* kc, const float* vc, int64_t B, int64_t S_cap,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(S));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * nq; ++bh) {
      const int64_t b = bh / nq, h = bh % nq, hk = h / G;
      const float* qi = q + bh * hd;
      const float* kb_ = kc + b * S_cap * nkv * hd;
      const float* vb_ = vc + b * S_cap * nkv * hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        s[j] = dotf(qi, kb_ + (j * nkv + hk) * hd, hd) * scale;
        mx = std::max(mx, s[j]);
      }
      const float sum = exp_store_sum(s.data(), s.data(), S, mx, nullptr, flush);
      float* o = out + bh * hd;
      std::fill_n(o, hd, 0.0f);
      for (int64_t j = 0; j < S; ++j) axpyf(o, s[j], vb_ + (j * nkv + hk) * hd, hd);
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
    }
  }
}

}  // namespace zaya::ops::cpu
