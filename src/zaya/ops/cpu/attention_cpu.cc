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

// exp over an array (arguments here are ≤ 0: scores minus their running max or minus the lse;
// expf_fast's floor at −87 gives ~1e-38, which is 0 for every sum it enters).
inline void exp_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = expf_fast(x[i]);
}

// Copies the key (or value) block rows j0..j0+nj of kv head hk ([T, nkv, hd] for one batch row)
// into Xt[d][j] (ld kBlock) and X[j][d] (ld hd), both zero-padded to kBlock keys so the tile
// products can always run over 64 keys (padded keys get P = 0).
inline void load_block(float* Xt, float* X, const float* src, int64_t j0, int64_t nj, int64_t nkv, int64_t hk,
                       int64_t hd) {
#if defined(__AVX512F__)
  if (nj == kBlock && hd % 16 == 0) {  // whole 16×16 squares: transposed in registers
    for (int64_t j = 0; j < kBlock; j += 16)
      for (int64_t d = 0; d < hd; d += 16) {
        const float* rows = src + ((j0 + j) * nkv + hk) * hd + d;
        transpose16(Xt + d * kBlock + j, kBlock, rows, nkv * hd);
        if (X)
          for (int64_t r = 0; r < 16; ++r) std::copy_n(rows + r * nkv * hd, 16, X + (j + r) * hd + d);
      }
    return;
  }
#endif
  for (int64_t j = 0; j < kBlock; ++j) {
    const float* row = src + ((j0 + j) * nkv + hk) * hd;
    for (int64_t d = 0; d < hd; ++d) {
      const float x = j < nj ? row[d] : 0.0f;
      Xt[d * kBlock + j] = x;
      if (X) X[j * hd + d] = x;
    }
  }
}

// P[ii][j] = exp(scale·S[ii][j] − L_i) for the causal, in-range keys of a tile and exactly 0 for the
// others (masked or padded), so they add nothing to any product.
inline void probs(float* P, const float* lse_row, int64_t i0, int64_t ni, int64_t j0, int64_t nj, float scale) {
#if defined(__AVX512F__)
  static_assert(kBlock == 64);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t ii = 0; ii < ni; ++ii) {  // 4 masked vectors per row: no scalar tails on diagonal tiles
    float* p = P + ii * kBlock;
    const int64_t jn = std::min(nj, i0 + ii - j0 + 1);
    const __m512 L = _mm512_set1_ps(lse_row[i0 + ii]);
    for (int64_t v = 0; v < 4; ++v) {
      const __mmask16 mk = first_lanes(jn - 16 * v);
      const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(p + 16 * v), sc, L);
      _mm512_storeu_ps(p + 16 * v, _mm512_maskz_mov_ps(mk, expf_fast_v(x)));
    }
  }
#else
  for (int64_t ii = 0; ii < ni; ++ii) {
    float* p = P + ii * kBlock;
    const int64_t jn = std::min(nj, i0 + ii - j0 + 1);
    const float L = lse_row[i0 + ii];
    for (int64_t j = 0; j < jn; ++j) p[j] = p[j] * scale - L;
    exp_inplace(p, jn);
    for (int64_t j = jn; j < kBlock; ++j) p[j] = 0.0f;
  }
#endif
}

}  // namespace

void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                   int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv, nblk = (T + kBlock - 1) / kBlock, rq = nq * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    AlignedVector<float> Kt(hd * kBlock), Vb(kBlock * hd), S(kBlock * kBlock), acc(kBlock * hd), m(kBlock),
        l(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nq * nblk; ++task) {
      // Largest query blocks first (most key blocks), for balance under the dynamic schedule.
      const int64_t qb = nblk - 1 - task % nblk, h = (task / nblk) % nq, b = task / (nblk * nq);
      const int64_t hk = h / G, i0 = qb * kBlock, ni = std::min(kBlock, T - i0);
      const float* kb_ = k + b * T * nkv * hd;
      const float* vb_ = v + b * T * nkv * hd;
      const float* qblk = q + ((b * T + i0) * nq + h) * hd;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t j0 = kb * kBlock, nj = std::min(kBlock, T - j0);
        load_block(Kt.data(), nullptr, kb_, j0, nj, nkv, hk, hd);
        // V rows in place when the block is full; a zero-padded copy for a short last block.
        const float* Vsrc = vb_ + (j0 * nkv + hk) * hd;
        int64_t ldv = nkv * hd;
        if (nj < kBlock) {
          for (int64_t j = 0; j < kBlock; ++j)
            for (int64_t d = 0; d < hd; ++d) Vb[j * hd + d] = j < nj ? Vsrc[j * ldv + d] : 0.0f;
          Vsrc = Vb.data();
          ldv = hd;
        }
        // The diagonal tile (i0 = j0) needs only keys j ≤ i: its products skip the rest.
        const Causal diag_cols = kb == qb ? Causal::cols_le_row : Causal::none;
        const Causal diag_k = kb == qb ? Causal::k_le_row : Causal::none;
        mm(S.data(), kBlock, qblk, rq, 1, Kt.data(), kBlock, ni, kBlock, hd, false, diag_cols);  // S = Q·Kᵀ
        for (int64_t ii = 0; ii < ni; ++ii) {
          float* s = S.data() + ii * kBlock;
          const int64_t jn = std::min(nj, i0 + ii - j0 + 1);  // causal: keys j ≤ i
          // Online softmax: the row's new max, P = exp(s·scale − max) in place (0 past jn), its sum
          // in 16 lanes (exp_store_sum's order), and the factor that rescales what was
          // accumulated under the old max.
          float mx, sum;
#if defined(__AVX512F__)
          // As 4 masked vectors in registers: diagonal tiles have every jn, and scalar tails cost
          // more than the exps.
          __m512 x[4];
          __mmask16 mk[4];
          __m512 vmax = _mm512_set1_ps(-INFINITY);
          for (int v = 0; v < 4; ++v) {
            mk[v] = first_lanes(jn - 16 * v);
            x[v] = _mm512_maskz_mul_ps(mk[v], _mm512_loadu_ps(s + 16 * v), _mm512_set1_ps(scale));
            vmax = _mm512_mask_max_ps(vmax, mk[v], vmax, x[v]);
          }
          float lane[16];
          _mm512_storeu_ps(lane, vmax);
          mx = std::max(m[ii], *std::max_element(lane, lane + 16));
          __m512 lanes = _mm512_setzero_ps();
          for (int v = 0; v < 4; ++v) {
            const __m512 e = _mm512_maskz_mov_ps(mk[v], expf_fast_v(_mm512_sub_ps(x[v], _mm512_set1_ps(mx))));
            _mm512_storeu_ps(s + 16 * v, e);
            lanes = _mm512_add_ps(lanes, e);
          }
          _mm512_storeu_ps(lane, lanes);
          sum = sum16(lane);
#else
          for (int64_t j = 0; j < jn; ++j) s[j] *= scale;
          mx = std::max(m[ii], maxf(s, jn));  // 16 lanes: a scalar max chain does not vectorize
          sum = exp_store_sum(s, s, jn, mx);
          for (int64_t j = jn; j < kBlock; ++j) s[j] = 0.0f;
#endif
          const float alpha = std::exp(m[ii] - mx);  // exp(−inf) = 0 on the first block
          m[ii] = mx;
          l[ii] = l[ii] * alpha + sum;
          if (alpha != 1.0f) {  // the max did not move: nothing to rescale
            float* a = acc.data() + ii * hd;
            for (int64_t d = 0; d < hd; ++d) a[d] *= alpha;
          }
        }
        mm(acc.data(), hd, S.data(), kBlock, 1, Vsrc, ldv, ni, hd, kBlock, true, diag_k);  // acc += P·V
      }
      for (int64_t ii = 0; ii < ni; ++ii) {
        const int64_t i = i0 + ii;
        const float inv = 1.0f / l[ii];
        float* o = out + ((b * T + i) * nq + h) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = acc[ii * hd + d] * inv;
        lse[(b * nq + h) * T + i] = m[ii] + std::log(l[ii]);
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
// same for any thread count. (B·nkv tasks: enough for the CPU's few threads at training shapes.)
// dS carries the factor scale.
void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                   const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t nq,
                   int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv, nblk = (T + kBlock - 1) / kBlock, rq = nq * hd, rk = nkv * hd;
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
        dS(kBlock * kBlock), acc(kBlock * hd), acc2(kBlock * hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nkv; ++task) {
      const int64_t hk = task % nkv, b = task / nkv;
      for (int64_t i = 0; i < T; ++i)  // this task's dQ rows start at 0 and accumulate over key blocks
        std::fill_n(dq + ((b * T + i) * nq + hk * G) * hd, G * hd, 0.0f);
      for (int64_t kb = 0; kb < nblk; ++kb) {
        const int64_t j0 = kb * kBlock, nj = std::min(kBlock, T - j0);
        load_block(Kt.data(), Kb.data(), k + b * T * rk, j0, nj, nkv, hk, hd);
        load_block(Vt.data(), nullptr, v + b * T * rk, j0, nj, nkv, hk, hd);
        std::fill(acc.begin(), acc.end(), 0.0f);   // dK rows of this block
        std::fill(acc2.begin(), acc2.end(), 0.0f);  // dV rows
        for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
          const float* Lrow = lse + (b * nq + h) * T;
          const float* Drow = D.data() + (b * nq + h) * T;
          for (int64_t qb = kb; qb < nblk; ++qb) {  // causal: only queries i ≥ j0 see this block
            const int64_t i0 = qb * kBlock, ni = std::min(kBlock, T - i0);
            const int64_t row0 = (b * T + i0) * nq + h;
            // On the diagonal tile (qb = kb) each product skips what the causal mask makes zero
            // or unused (Causal in tile_mm.h); scores past a row's last key are never computed.
            const bool diag = qb == kb;
            const Causal cols = diag ? Causal::cols_le_row : Causal::none;
            mm(P.data(), kBlock, q + row0 * hd, rq, 1, Kt.data(), kBlock, ni, kBlock, hd, false, cols);
            probs(P.data(), Lrow, i0, ni, j0, nj, scale);
            mm(dS.data(), kBlock, dout + row0 * hd, rq, 1, Vt.data(), kBlock, ni, kBlock, hd, false, cols);  // dP
            // dS = P ⊙ (dP − D)·scale in place of dP over each row's visible keys, 0 past them
            // (where dP may not have been computed).
            for (int64_t ii = 0; ii < ni; ++ii) {
              const float Di = Drow[i0 + ii];
              float* ds = dS.data() + ii * kBlock;
              const float* p = P.data() + ii * kBlock;
              const int64_t jn = std::min(nj, i0 + ii - j0 + 1);
              for (int64_t j = 0; j < jn; ++j) ds[j] = scale * p[j] * (ds[j] - Di);
              std::fill(ds + jn, ds + kBlock, 0.0f);
            }
            // dV += Pᵀ·dO and dK += dSᵀ·Q over this block's ni query rows (Aᵀ by stride swap).
            const Causal k_from = diag ? Causal::k_ge_row : Causal::none;
            mm(acc2.data(), hd, P.data(), 1, kBlock, dout + row0 * hd, rq, nj, hd, ni, true, k_from);
            mm(acc.data(), hd, dS.data(), 1, kBlock, q + row0 * hd, rq, nj, hd, ni, true, k_from);
            mm(dq + row0 * hd, rq, dS.data(), kBlock, 1, Kb.data(), hd, ni, hd, kBlock, true,
               diag ? Causal::k_le_row : Causal::none);  // dQ += dS·K
          }
        }
        for (int64_t j = 0; j < nj; ++j) {
          std::copy_n(acc.data() + j * hd, hd, dk + ((b * T + j0 + j) * nkv + hk) * hd);
          std::copy_n(acc2.data() + j * hd, hd, dv + ((b * T + j0 + j) * nkv + hk) * hd);
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
      const float sum = exp_store_sum(s.data(), s.data(), S, mx);
      float* o = out + bh * hd;
      std::fill_n(o, hd, 0.0f);
      for (int64_t j = 0; j < S; ++j) axpyf(o, s[j], vb_ + (j * nkv + hk) * hd, hd);
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
    }
  }
}

}  // namespace zaya::ops::cpu
