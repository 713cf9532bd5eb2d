// Tiled causal GQA attention on the CPU (the math and the contract are in zaya/ops/attention.h).
//
// Layout: q [B, T, nq, hd], k/v [B, T, nkv, hd]; row i of head h is at ((b·T + i)·nq + h)·hd.
// Per tile, the key (and value) block is transposed into Kt[d][j] so that the scores of one query
// row against the block are hd AXPYs over contiguous j — loops the compiler vectorizes without
// reassociating a reduction — and P·V is an AXPY over hd per key.
#include "zaya/ops/cpu/attention_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zaya/ops/cpu/seq_vec.h"

namespace zaya::ops::cpu {

namespace {

constexpr int64_t kBlock = 64;  // queries and keys per tile: Kt and Vt (2·64·hd floats) stay in L1/L2

// exp(x) for a whole array, branch-free so it vectorizes: x = n·ln2 + r with |r| ≤ ln2/2, a degree-7
// polynomial for e^r (Cephes' coefficients, ~1 ulp) and 2^n put into the exponent bits. Arguments
// here are ≤ 0 (scores minus their running max, or minus the logsumexp); they are clamped at −87
// so 2^n stays a normal float (e^−87 ≈ 1.6e−38 is 0 for every sum it enters).
inline void exp_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = std::min(std::max(x[i], -87.0f), 88.0f);
    // Round v·log2(e) to the nearest integer by adding and subtracting 1.5·2^23.
    float t = v * 1.44269504088896341f + 12582912.0f;
    float nf = t - 12582912.0f;
    int32_t ni;
    std::memcpy(&ni, &t, 4);
    ni -= 0x4B400000;  // bits of 12582912.0f
    float r = v - nf * 0.693359375f - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (ni + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    x[i] = p * scale;
  }
}

// Copies rows j0..j0+nj of head hk of src ([T, nkv, hd] for batch row b) into dst[d][j] (ld kBlock).
inline void transpose_block(float* dst, const float* src, int64_t j0, int64_t nj, int64_t nkv, int64_t hk,
                            int64_t hd) {
  for (int64_t j = 0; j < nj; ++j) {
    const float* row = src + ((j0 + j) * nkv + hk) * hd;
    for (int64_t d = 0; d < hd; ++d) dst[d * kBlock + j] = row[d];
  }
}

// s[0..nj) = x · Kt[:, 0..nj)  (one query row against a transposed key block)
inline void row_scores(float* s, const float* x, const float* Kt, int64_t nj, int64_t hd) {
  for (int64_t j = 0; j < nj; ++j) s[j] = 0.0f;
  for (int64_t d = 0; d < hd; ++d) axpyf(s, x[d], Kt + d * kBlock, nj);
}

}  // namespace

void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                   int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv, nblk = (T + kBlock - 1) / kBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    std::vector<float> Kt(hd * kBlock), s(kBlock), acc(kBlock * hd), m(kBlock), l(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nq * nblk; ++task) {
      // Largest query blocks first (most key blocks), for balance under the dynamic schedule.
      const int64_t qb = nblk - 1 - task % nblk, h = (task / nblk) % nq, b = task / (nblk * nq);
      const int64_t hk = h / G, i0 = qb * kBlock, ni = std::min(kBlock, T - i0);
      const float* kb_ = k + b * T * nkv * hd;
      const float* vb_ = v + b * T * nkv * hd;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t j0 = kb * kBlock, nj = std::min(kBlock, T - j0);
        transpose_block(Kt.data(), kb_, j0, nj, nkv, hk, hd);
        for (int64_t ii = 0; ii < ni; ++ii) {
          const int64_t i = i0 + ii;
          const int64_t jn = std::min(nj, i - j0 + 1);  // causal: keys j ≤ i
          const float* qi = q + ((b * T + i) * nq + h) * hd;
          row_scores(s.data(), qi, Kt.data(), jn, hd);
          float mx = m[ii];
          for (int64_t j = 0; j < jn; ++j) {
            s[j] *= scale;
            mx = std::max(mx, s[j]);
          }
          // Online softmax: rescale what was accumulated under the old max.
          const float alpha = std::exp(m[ii] - mx);  // exp(−inf) = 0 on the first block
          m[ii] = mx;
          for (int64_t j = 0; j < jn; ++j) s[j] -= mx;
          exp_inplace(s.data(), jn);
          float sum = 0.0f;
          for (int64_t j = 0; j < jn; ++j) sum += s[j];
          l[ii] = l[ii] * alpha + sum;
          float* a = acc.data() + ii * hd;
          for (int64_t d = 0; d < hd; ++d) a[d] *= alpha;
          for (int64_t j = 0; j < jn; ++j) axpyf(a, s[j], vb_ + ((j0 + j) * nkv + hk) * hd, hd);
        }
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
// Pass 1 owns dQ rows (per b, q head, query block); pass 2 owns dK/dV rows (per b, kv head, key
// block) and sums over the G q heads then the query rows in order. P is recomputed in both passes:
// two more small matmuls than a single pass with atomics, in exchange for determinism.
void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                   const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t nq,
                   int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv, nblk = (T + kBlock - 1) / kBlock;
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
    std::vector<float> Kt(hd * kBlock), Vt(hd * kBlock), p(kBlock), dp(kBlock);
    // Pass 1: dQ.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nq * nblk; ++task) {
      const int64_t qb = nblk - 1 - task % nblk, h = (task / nblk) % nq, b = task / (nblk * nq);
      const int64_t hk = h / G, i0 = qb * kBlock, ni = std::min(kBlock, T - i0);
      const float* kb_ = k + b * T * nkv * hd;
      const float* vb_ = v + b * T * nkv * hd;
      for (int64_t ii = 0; ii < ni; ++ii)
        std::fill_n(dq + ((b * T + i0 + ii) * nq + h) * hd, hd, 0.0f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t j0 = kb * kBlock, nj = std::min(kBlock, T - j0);
        transpose_block(Kt.data(), kb_, j0, nj, nkv, hk, hd);
        transpose_block(Vt.data(), vb_, j0, nj, nkv, hk, hd);
        for (int64_t ii = 0; ii < ni; ++ii) {
          const int64_t i = i0 + ii, jn = std::min(nj, i - j0 + 1);
          const int64_t row = (b * T + i) * nq + h;
          const float L = lse[(b * nq + h) * T + i], Di = D[(b * nq + h) * T + i];
          row_scores(p.data(), q + row * hd, Kt.data(), jn, hd);
          for (int64_t j = 0; j < jn; ++j) p[j] = p[j] * scale - L;
          exp_inplace(p.data(), jn);
          row_scores(dp.data(), dout + row * hd, Vt.data(), jn, hd);
          float* dqi = dq + row * hd;
          for (int64_t j = 0; j < jn; ++j)
            axpyf(dqi, scale * p[j] * (dp[j] - Di), kb_ + ((j0 + j) * nkv + hk) * hd, hd);
        }
      }
    }
    // Pass 2: dK, dV.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nkv * nblk; ++task) {
      const int64_t kb = task % nblk, hk = (task / nblk) % nkv, b = task / (nblk * nkv);
      const int64_t j0 = kb * kBlock, nj = std::min(kBlock, T - j0);
      const float* kb_ = k + b * T * nkv * hd;
      const float* vb_ = v + b * T * nkv * hd;
      transpose_block(Kt.data(), kb_, j0, nj, nkv, hk, hd);
      transpose_block(Vt.data(), vb_, j0, nj, nkv, hk, hd);
      for (int64_t j = 0; j < nj; ++j) {
        std::fill_n(dk + ((b * T + j0 + j) * nkv + hk) * hd, hd, 0.0f);
        std::fill_n(dv + ((b * T + j0 + j) * nkv + hk) * hd, hd, 0.0f);
      }
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        for (int64_t i = j0; i < T; ++i) {  // causal: only queries i ≥ j0 see this block
          const int64_t jn = std::min(nj, i - j0 + 1);
          const int64_t row = (b * T + i) * nq + h;
          const float L = lse[(b * nq + h) * T + i], Di = D[(b * nq + h) * T + i];
          row_scores(p.data(), q + row * hd, Kt.data(), jn, hd);
          for (int64_t j = 0; j < jn; ++j) p[j] = p[j] * scale - L;
          exp_inplace(p.data(), jn);
          row_scores(dp.data(), dout + row * hd, Vt.data(), jn, hd);
          for (int64_t j = 0; j < jn; ++j) {
            const int64_t r = (b * T + j0 + j) * nkv + hk;
            axpyf(dv + r * hd, p[j], dout + row * hd, hd);
            axpyf(dk + r * hd, scale * p[j] * (dp[j] - Di), q + row * hd, hd);
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
      for (int64_t j = 0; j < S; ++j) s[j] -= mx;
      exp_inplace(s.data(), S);
      float sum = 0.0f;
      for (int64_t j = 0; j < S; ++j) sum += s[j];
      float* o = out + bh * hd;
      std::fill_n(o, hd, 0.0f);
      for (int64_t j = 0; j < S; ++j) axpyf(o, s[j], vb_ + (j * nkv + hk) * hd, hd);
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
    }
  }
}

}  // namespace zaya::ops::cpu
