// Causal attention of a block of queries at an offset against a longer key prefix (the contract is
// in zaya/ops/attention.h, attention_at_forward): what a context-parallel rank runs for each of its
// sequence chunks against the K/V gathered from its group.
//
// Row by row: each query's scores over its visible keys (dot products along hd), the softmax, and
// the value sum as AXPYs. The front uses it only when the chunk's offset is not a multiple of 64:
// attention_cpu.cc's tiles assume a query block's diagonal is a key block. The cost is per query
// row O(keys · hd) like the tiles', at the lower speed of vector dot products (about a quarter of
// the tiled kernel's at the demo's shapes, docs/results/context-parallel.md).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "zaya/ops/cpu/attention_cpu.h"
#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/sequence_math.h"

namespace zaya::ops::cpu {

namespace {
// Probabilities below 2^-100 are stored as exact 0, as the tiled kernels do (attention_cpu.cc).
constexpr FlushBelow flush{kTinyProbability};
constexpr int64_t kRowBlock = 16;  // queries per forward task: their key rows stay in L2 between them
}  // namespace

// One task per (batch row, query head, block of 16 queries), the blocks with the most keys first.
void attention_at_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B,
                      int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd, int64_t key_end) {
  if (key_end < 0) key_end = q_pos + Tq;
  const int64_t G = nq / nkv, rk = nkv * hd, nblk = (Tq + kRowBlock - 1) / kRowBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(q_pos + Tq));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nq * nblk; ++task) {
      const int64_t qb = nblk - 1 - task % nblk, h = (task / nblk) % nq, b = task / (nblk * nq), hk = h / G;
      const float* kb = k + b * Tk * rk + hk * hd;  // key j at kb + j·rk
      const float* vb = v + b * Tk * rk + hk * hd;
      for (int64_t i = qb * kRowBlock; i < std::min(Tq, (qb + 1) * kRowBlock); ++i) {
        const int64_t nk = std::min(key_end, q_pos + i + 1);  // causal: keys j ≤ q_pos + i
        const float* qi = q + ((b * Tq + i) * nq + h) * hd;
        float mx = -INFINITY;
        for (int64_t j = 0; j < nk; ++j) {
          s[static_cast<size_t>(j)] = dotf(qi, kb + j * rk, hd) * scale;
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        const float sum = exp_store_sum(s.data(), s.data(), nk, mx, nullptr, flush);
        float* o = out + ((b * Tq + i) * nq + h) * hd;
        std::fill_n(o, hd, 0.0f);
        for (int64_t j = 0; j < nk; ++j) axpyf(o, s[static_cast<size_t>(j)], vb + j * rk, hd);
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
        lse[(b * nq + h) * Tq + i] = mx + std::log(sum);
      }
    }
  }
}

// Backward, with P_ij = exp(scale·q_i·k_j − lse_i), D_i = ⟨dO_i, O_i⟩, dS_ij = scale·P_ij(⟨dO_i, V_j⟩ − D_i):
// dQ_i = Σ_j dS_ij K_j (written), dK_j += Σ_i dS_ij Q_i, dV_j += Σ_i P_ij dO_i. One task per
// (batch row, kv head) owns the dK, dV rows of that head and the dQ rows of its G query heads, and
// walks heads then queries in order: every output element has one writer and a fixed summation
// order, so the result is bitwise the same for any thread count.
void attention_at_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                      const float* v, const float* out, const float* lse, int64_t B, int64_t Tq, int64_t Tk,
                      int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd, int64_t key_end, bool accumulate_q) {
  if (key_end < 0) key_end = q_pos + Tq;
  const int64_t G = nq / nkv, rk = nkv * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(q_pos + Tq)), ds(static_cast<size_t>(q_pos + Tq));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * nkv; ++task) {
      const int64_t hk = task % nkv, b = task / nkv;
      const float* kb = k + b * Tk * rk + hk * hd;
      const float* vb = v + b * Tk * rk + hk * hd;
      float* dkb = dk + b * Tk * rk + hk * hd;
      float* dvb = dv + b * Tk * rk + hk * hd;
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t nk = std::min(key_end, q_pos + i + 1), row = (b * Tq + i) * nq + h;
          const float* qi = q + row * hd;
          const float* doi = dout + row * hd;
          const float D = dotf(doi, out + row * hd, hd), L = lse[(b * nq + h) * Tq + i];
          for (int64_t j = 0; j < nk; ++j) {
            const float pj = flush(math::attention_prob(dotf(qi, kb + j * rk, hd), scale, L));
            p[static_cast<size_t>(j)] = pj;
            ds[static_cast<size_t>(j)] = scale * math::attention_dscore(pj, dotf(doi, vb + j * rk, hd), D);
          }
          float* dqi = dq + row * hd;
          if (!accumulate_q) std::fill_n(dqi, hd, 0.0f);
          for (int64_t j = 0; j < nk; ++j) {
            const float dsj = ds[static_cast<size_t>(j)];
            axpyf(dqi, dsj, kb + j * rk, hd);
            axpyf(dkb + j * rk, dsj, qi, hd);
            axpyf(dvb + j * rk, p[static_cast<size_t>(j)], doi, hd);
          }
        }
    }
  }
}

// Per row: the merged lse and the two weights (math::softmax_merge), then the output as their sum.
void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t B, int64_t T,
                     int64_t nq, int64_t hd) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T * nq; ++row) {
    const int64_t h = row % nq, i = (row / nq) % T, b = row / (nq * T), l = (b * nq + h) * T + i;
    const math::SoftmaxMerge w = math::softmax_merge(lse_a[l], lse_b[l]);
    float* oa = out_a + row * hd;
    const float* ob = out_b + row * hd;
    for (int64_t d = 0; d < hd; ++d) oa[d] = math::softmax_merge_out(w, oa[d], ob[d]);
    lse_a[l] = w.lse;
  }
}

}  // namespace zaya::ops::cpu
