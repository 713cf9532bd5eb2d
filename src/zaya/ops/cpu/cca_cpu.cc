// CPU kernels of the CCA block (see zaya/ops/cca.h for the math and the conventions).
//
// The convolutions follow transformers' ZayaCCAProjection: pad the sequence ONCE with two zero time
// steps, depthwise Conv1d(k=2) → T+1 slots, grouped Conv1d(k=2, one group per head) → T outputs.
// With zp_s = z_{s-2} (zero for s < 2) the depthwise slot s ∈ [0, T] is
//     d_s[c] = db[c] + dw[c,0]·z_{s-2}[c] + dw[c,1]·z_{s-1}[c]
// and output t of head g (channels o, i of that head) is
//     out_t[o] = gb[o] + Σ_i gw[o,i,0]·d_t[i] + gw[o,i,1]·d_{t+1}[i].
// Storing d_t and d_{t+1} interleaved ([i][tap]) makes the grouped conv a dot of length 2·hd with the
// contiguous row gw[o, :, :].
#include "zaya/ops/cpu/cca_cpu.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/cpu/tile_mm.h"

namespace zaya::ops::cpu {

namespace {

// Depthwise slots s and s+1 of one head (channels c0..c0+hd) of batch row zb ([T, C] at b):
// d_s[i] into d0[i·step] and d_{s+1}[i] into d1[i·step]. Padding (negative time) reads as zero.
// The forward interleaves the pair (d1 = d0 + 1, step 2: the [i][tap] order of the grouped weight's
// rows); the backward stores it planar (d1 = d0 + hd, step 1).
inline void depthwise_pair(float* d0, float* d1, int64_t step, const float* zb, int64_t s, int64_t C, int64_t c0,
                           int64_t hd, const float* dw, const float* db) {
  const float* zm2 = s - 2 >= 0 ? zb + (s - 2) * C : nullptr;  // z_{s-2}
  const float* zm1 = s - 1 >= 0 ? zb + (s - 1) * C : nullptr;  // z_{s-1}
  const float* z0 = s >= 0 ? zb + s * C : nullptr;             // z_s (newest for slot s+1)
  for (int64_t i = 0; i < hd; ++i) {
    int64_t c = c0 + i;
    float a = zm2 ? zm2[c] : 0.0f, b = zm1 ? zm1[c] : 0.0f, n = z0 ? z0[c] : 0.0f;
    d0[i * step] = db[c] + dw[2 * c] * a + dw[2 * c + 1] * b;
    d1[i * step] = db[c] + dw[2 * c] * b + dw[2 * c + 1] * n;
  }
}

// Grouped conv of one head from the interleaved depthwise pair (the decode step's single token).
inline void grouped_head(float* out, const float* dd, int64_t c0, int64_t hd, const float* gw,
                         const float* gb) {
  for (int64_t o = c0; o < c0 + hd; ++o) out[o] = gb[o] + dotf(gw + o * 2 * hd, dd, 2 * hd);
}

// Scratch of at least n floats that keeps its pages from call to call (one buffer per calling
// thread and slot). A fresh multi-MB vector per call goes back to the OS when freed (glibc trims
// the heap top) and page-faults in again on the next call: 35 of the conv backward's 88 ms per
// demo step, 1 thread. Contents are unspecified: callers write before they read.
template <int Slot>
float* scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

constexpr int64_t kRows = 64;   // tokens per task of the grouped-conv products
constexpr int64_t kLanes = 16;  // dotf's partial sums

}  // namespace

// Forward: out_t[o] = gb[o] + dotf(gw[o, :, :], dd_t) per head, dd_t the interleaved depthwise pair.
// The summation order is dotf's and must stay so: the qk_norm temperature's gradient downstream is
// ill-conditioned, and the HF parity test's 1e-4 bound on it holds with this order (2e-5) but not
// with a single FMA chain over the 2·hd inputs (1.3e-4; both are fp32 rounding, and HF in float64
// is 1.3e-4 from HF in fp32 there too: docs/results/model-cpu.md). dotf keeps 16 partial sums, lane
// l an FMA chain over the inputs k ≡ l (mod 16), then adds them in a fixed tree. Each lane is
// itself a small matrix product over every 16th input, so per (token block, head) the conv is 16
// tile products P_l = DD[:, l::16]·Wᵀ[l::16, :] and dotf's tree over them, elementwise: the same
// bits as dotf per output, vectorized over the head's outputs instead of one horizontal sum each
// (dotf's `acc += a·b` compiles to an FMA, as mm's chain; the decode step still calls dotf, and
// CcaConv.DecodeEqualsFullForwardAtEveryPosition checks the two bitwise).
void cca_conv_fwd(float* out, const float* z, const float* dw, const float* db, const float* gw,
                  const float* gb, int64_t B, int64_t T, int64_t heads, int64_t hd) {
  const int64_t C = heads * hd, N = B * T, K2 = 2 * hd, nblk = (N + kRows - 1) / kRows;
  // gwT[g][k][o] = gw[g·hd + o][k]: row k holds input k's weights for the head's hd outputs (mm's B).
  std::vector<float> gwT(static_cast<size_t>(C * K2));
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t o = 0; o < hd; ++o)
      for (int64_t k = 0; k < K2; ++k) gwT[(g * K2 + k) * hd + o] = gw[(g * hd + o) * K2 + k];
#pragma omp parallel
  {
    float* dd = scratch<0>(kRows * K2);
    float* P = scratch<1>(kLanes * kRows * hd);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < nblk * heads; ++task) {
      const int64_t g = task % heads, r0 = (task / heads) * kRows, nr = std::min(kRows, N - r0);
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t bt = r0 + r;
        float* d = dd + r * K2;
        depthwise_pair(d, d + 1, 2, z + (bt / T) * T * C, bt % T, C, g * hd, hd, dw, db);
      }
      // P_l [nr, hd] (ld hd) = Σ over k = l, l+16, … < K2 of DD[:, k]·gwT[k, :], one FMA chain from 0.
      for (int64_t l = 0; l < kLanes; ++l) {
        const int64_t len = l < K2 ? (K2 - l + kLanes - 1) / kLanes : 0;
        mm(P + l * kRows * hd, hd, dd + l, K2, kLanes, gwT.data() + (g * K2 + std::min(l, K2 - 1)) * hd,
           kLanes * hd, nr, hd, len, false);
      }
      // dotf's tree: lanes l += l+8, then l += l+4, then (0 + 2) + (1 + 3).
      const int64_t m = nr * hd;
      auto lane = [&](int64_t l) { return P + l * kRows * hd; };
      for (int64_t l = 0; l < 8; ++l)
        for (int64_t e = 0; e < m; ++e) lane(l)[e] += lane(l + 8)[e];
      for (int64_t l = 0; l < 4; ++l)
        for (int64_t e = 0; e < m; ++e) lane(l)[e] += lane(l + 4)[e];
      for (int64_t r = 0; r < nr; ++r) {
        float* o = out + (r0 + r) * C + g * hd;
        const float* b = gb + g * hd;
        const int64_t e0 = r * hd;
        for (int64_t i = 0; i < hd; ++i)
          o[i] = b[i] + ((lane(0)[e0 + i] + lane(2)[e0 + i]) + (lane(1)[e0 + i] + lane(3)[e0 + i]));
      }
    }
  }
}

// Backward, in a planar layout: per token and head, [tap][i] instead of the weight's [i][tap], so the
// elementwise tail reads each tap contiguously (the interleaved layout made it read at stride 2).
// gwp[o][tap][i] = gw[o][i][tap]; dd[n][g][tap][i] = d_{t+tap}[g·hd + i]. Per head g:
//   E_g = dout_g · gwp_g  (E[n][g][tap][i]: the gradient reaching depthwise slot t+tap)
//   dgw_g += dout_gᵀ · dd_g  (computed planar, then added in the weight's order),
// as tile products, each element one ordered FMA chain; then elementwise per channel block, over
// (b, s) in order:
//   G_s      = E_s[0] + E_{s-1}[1]           (total gradient of depthwise slot s, s ∈ [0, T])
//   ddb += G_s, ddw[·,0] += G_s·z_{s-2}, ddw[·,1] += G_s·z_{s-1},
//   dz_t = G_{t+1}·dw[·,1] + G_{t+2}·dw[·,0],  dgb += dout_t.
// Every output element has one writer and a fixed order: bitwise deterministic for any thread count.
void cca_conv_bwd(float* dz, float* ddw, float* ddb, float* dgw, float* dgb, const float* dout,
                  const float* z, const float* dw, const float* db, const float* gw, int64_t B,
                  int64_t T, int64_t heads, int64_t hd) {
  const int64_t C = heads * hd, N = B * T, K2 = 2 * hd, C2 = 2 * C, nblk = (N + kRows - 1) / kRows;
  std::vector<float> gwp(static_cast<size_t>(C * K2)), dgwp(static_cast<size_t>(C * K2));
  for (int64_t o = 0; o < C; ++o)
    for (int64_t i = 0; i < hd; ++i)
      for (int64_t tap = 0; tap < 2; ++tap) gwp[o * K2 + tap * hd + i] = gw[o * K2 + 2 * i + tap];
  float* dd = scratch<2>(N * C2);  // every element of dd and E is written before it is read
  float* E = scratch<3>(N * C2);
  constexpr int64_t kTok = 256;  // tokens per dgw step: that slice of dd stays in L2 for all of a head's rows
  constexpr int64_t kCh = 64;  // channels per tail task: its inner loops vectorize over them
  const int64_t cblk = (hd + kCh - 1) / kCh;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < N; ++bt)
      for (int64_t g = 0; g < heads; ++g) {
        float* d = dd + bt * C2 + g * K2;
        depthwise_pair(d, d + hd, 1, z + (bt / T) * T * C, bt % T, C, g * hd, hd, dw, db);
      }
    // (implicit barrier: dd is complete)
#pragma omp for schedule(static) nowait
    for (int64_t task = 0; task < heads * nblk; ++task) {
      const int64_t g = task / nblk, r0 = (task % nblk) * kRows, nr = std::min(kRows, N - r0);
      mm(E + r0 * C2 + g * K2, C2, dout + r0 * C + g * hd, C, 1, gwp.data() + g * hd * K2, K2, nr, K2, hd,
         false);
    }
#pragma omp for schedule(static)
    for (int64_t g = 0; g < heads; ++g) {
      float* dgw_g = dgwp.data() + g * hd * K2;
      for (int64_t n0 = 0; n0 < N; n0 += kTok)  // one FMA chain per element over the tokens, in order
        mm(dgw_g, K2, dout + n0 * C + g * hd, 1, C, dd + n0 * C2 + g * K2, C2, hd, K2, std::min(kTok, N - n0),
           n0 > 0);
      for (int64_t o = g * hd; o < (g + 1) * hd; ++o)
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t tap = 0; tap < 2; ++tap) dgw[o * K2 + 2 * i + tap] += dgwp[o * K2 + tap * hd + i];
    }
    // (implicit barrier: E is complete)
#pragma omp for schedule(static)
    for (int64_t task = 0; task < heads * cblk; ++task) {
      const int64_t g = task / cblk, i0 = (task % cblk) * kCh, nc = std::min(kCh, hd - i0), c0 = g * hd + i0;
      float G[kCh], Gp[kCh], sdb[kCh], sw0[kCh], sw1[kCh], sgb[kCh], w0[kCh], w1[kCh];
      for (int64_t i = 0; i < nc; ++i) {
        sdb[i] = ddb[c0 + i], sw0[i] = ddw[2 * (c0 + i)], sw1[i] = ddw[2 * (c0 + i) + 1], sgb[i] = dgb[c0 + i];
        w0[i] = dw[2 * (c0 + i)], w1[i] = dw[2 * (c0 + i) + 1];
      }
      for (int64_t b = 0; b < B; ++b) {
        const float* zb = z + b * T * C + c0;
        const float* e0 = E + b * T * C2 + g * K2 + i0;  // tap 0 of token (b, s): e0[s·C2]
        const float* e1 = e0 + hd;                               // tap 1
        float* dzb = dz + b * T * C + c0;
        for (int64_t i = 0; i < nc; ++i) Gp[i] = 0.0f;
        for (int64_t s = 0; s <= T + 1; ++s) {  // slot T+1 does not exist: G = 0 there, for dz_{T-1}
          for (int64_t i = 0; i < nc; ++i) G[i] = (s < T ? e0[s * C2 + i] : 0.0f) + (s >= 1 && s <= T ? e1[(s - 1) * C2 + i] : 0.0f);
          if (s <= T)
            for (int64_t i = 0; i < nc; ++i) {
              const float a = s >= 2 ? zb[(s - 2) * C + i] : 0.0f, p = s >= 1 ? zb[(s - 1) * C + i] : 0.0f;
              sdb[i] += G[i];
              sw0[i] += G[i] * a;
              sw1[i] += G[i] * p;
            }
          if (s >= 2)
            for (int64_t i = 0; i < nc; ++i) dzb[(s - 2) * C + i] = Gp[i] * w1[i] + G[i] * w0[i];
          for (int64_t i = 0; i < nc; ++i) Gp[i] = G[i];
        }
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < nc; ++i) sgb[i] += dout[(b * T + t) * C + c0 + i];
      }
      for (int64_t i = 0; i < nc; ++i) {
        ddb[c0 + i] = sdb[i], ddw[2 * (c0 + i)] = sw0[i], ddw[2 * (c0 + i) + 1] = sw1[i], dgb[c0 + i] = sgb[i];
      }
    }
  }
}

void cca_conv_decode(float* out, float* state, const float* z, const float* dw, const float* db,
                     const float* gw, const float* gb, int64_t B, int64_t heads, int64_t hd) {
  const int64_t C = heads * hd;
  std::vector<float> win(3 * C), dd(2 * hd);
  for (int64_t b = 0; b < B; ++b) {
    // The window [z_{t-2}, z_{t-1}, z_t] laid out as a 3-step sequence; slot 2 of its depthwise
    // conv is d_t and slot 3 is d_{t+1}, exactly what the full forward computes at position t.
    float* st = state + b * 2 * C;
    std::copy(st, st + 2 * C, win.begin());
    std::copy(z + b * C, z + (b + 1) * C, win.begin() + 2 * C);
    for (int64_t g = 0; g < heads; ++g) {
      depthwise_pair(dd.data(), dd.data() + 1, 2, win.data(), 2, C, g * hd, hd, dw, db);
      grouped_head(out + b * C, dd.data(), g * hd, hd, gw, gb);
    }
    std::copy(win.begin() + C, win.end(), st);
  }
}

void mean_skip_fwd(float* q, float* k, const float* conv, const float* qt, const float* kt, int64_t N,
                   int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv, C = (nq + nkv) * hd;
  const float inv_g = 1.0f / static_cast<float>(G);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* cv = conv + n * C;
    for (int64_t j = 0; j < nkv; ++j) {
      const float* kj = kt + (n * nkv + j) * hd;
      float* ko = k + (n * nkv + j) * hd;
      for (int64_t d = 0; d < hd; ++d) ko[d] = 0.0f;  // running Σ_h m_q^h of group j
      for (int64_t h = j * G; h < (j + 1) * G; ++h) {
        const float* qh = qt + (n * nq + h) * hd;
        float* qo = q + (n * nq + h) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          float m = (qh[d] + kj[d]) * 0.5f;
          qo[d] = cv[h * hd + d] + m;
          ko[d] += m;
        }
      }
      // mean = sum / G, as torch's mean; then the conv output is added.
      for (int64_t d = 0; d < hd; ++d) ko[d] = cv[(nq + j) * hd + d] + ko[d] * inv_g;
    }
  }
}

// dm_q^h = dq^h + dk^j / G;  dq̃^h = ½ dm_q^h;  dk̃^j = ½ Σ_{h in j} dm_q^h;  dconv = [dq, dk].
void mean_skip_bwd(float* dconv, float* dqt, float* dkt, const float* dq, const float* dk, int64_t N,
                   int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv, C = (nq + nkv) * hd;
  const float inv_g = 1.0f / static_cast<float>(G);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* dc = dconv + n * C;
    for (int64_t j = 0; j < nkv; ++j) {
      const float* dkj = dk + (n * nkv + j) * hd;
      float* dktj = dkt + (n * nkv + j) * hd;
      for (int64_t d = 0; d < hd; ++d) {
        dc[(nq + j) * hd + d] = dkj[d];
        dktj[d] = 0.0f;
      }
      for (int64_t h = j * G; h < (j + 1) * G; ++h) {
        const float* dqh = dq + (n * nq + h) * hd;
        float* dqth = dqt + (n * nq + h) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          float dm = dqh[d] + dkj[d] * inv_g;
          dc[h * hd + d] = dqh[d];
          dqth[d] = 0.5f * dm;
          dktj[d] += dm;
        }
      }
      for (int64_t d = 0; d < hd; ++d) dktj[d] *= 0.5f;
    }
  }
}

void value_shift_fwd(float* v, const float* vc, const float* vd, int64_t B, int64_t T, int64_t half) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    float* vo = v + bt * 2 * half;
    std::copy(vc + bt * half, vc + (bt + 1) * half, vo);
    if (bt % T == 0) std::fill(vo + half, vo + 2 * half, 0.0f);  // vd_{-1} = 0 at each row's start
    else std::copy(vd + (bt - 1) * half, vd + bt * half, vo + half);
  }
}

void value_shift_bwd(float* dvc, float* dvd, const float* dv, int64_t B, int64_t T, int64_t half) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* g = dv + bt * 2 * half;
    std::copy(g, g + half, dvc + bt * half);
    // vd_t feeds v_{t+1}; the last token's vd is used by no one (in this sequence).
    if (bt % T == T - 1) std::fill(dvd + bt * half, dvd + (bt + 1) * half, 0.0f);
    else std::copy(g + 2 * half + half, g + 4 * half, dvd + bt * half);
  }
}

void value_shift_decode(float* v, float* state, const float* vc, const float* vd, int64_t B, int64_t half) {
  for (int64_t b = 0; b < B; ++b) {
    std::copy(vc + b * half, vc + (b + 1) * half, v + b * 2 * half);
    std::copy(state + b * half, state + (b + 1) * half, v + b * 2 * half + half);
    std::copy(vd + b * half, vd + (b + 1) * half, state + b * half);
  }
}

namespace {
// s / max(‖x‖, ε) in the reference's order: the norm in fp32, then the python scalar √hd divided by it.
inline float norm_scale(const float* x, int64_t hd, float sqrt_hd) {
  float nrm = std::sqrt(dotf(x, x, hd));
  return sqrt_hd / std::max(nrm, FLT_EPSILON);
}
}  // namespace

void qk_norm_fwd(float* qo, float* ko, const float* q, const float* k, const float* temp, int64_t N,
                 int64_t nq, int64_t nkv, int64_t hd) {
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < nq; ++h) {
      const float* x = q + (n * nq + h) * hd;
      float* y = qo + (n * nq + h) * hd;
      float s = norm_scale(x, hd, sqrt_hd);
      for (int64_t d = 0; d < hd; ++d) y[d] = x[d] * s;
    }
    for (int64_t j = 0; j < nkv; ++j) {
      const float* x = k + (n * nkv + j) * hd;
      float* y = ko + (n * nkv + j) * hd;
      float s = norm_scale(x, hd, sqrt_hd);
      for (int64_t d = 0; d < hd; ++d) y[d] = (x[d] * s) * temp[j];
    }
  }
}

namespace {
// With y = x·s/n (n = ‖x‖ > ε): dx = (s/n)·(dy − x·(x·dy)/n²). Below ε the scale is the constant s/ε.
inline void norm_backward(float* dx, const float* x, const float* dy, float tau, int64_t hd, float sqrt_hd) {
  float nrm = std::sqrt(dotf(x, x, hd));
  if (nrm > FLT_EPSILON) {
    float s = sqrt_hd / nrm;
    float proj = tau * dotf(x, dy, hd) / (nrm * nrm);
    for (int64_t d = 0; d < hd; ++d) dx[d] = s * (tau * dy[d] - x[d] * proj);
  } else {
    float s = sqrt_hd / FLT_EPSILON;
    for (int64_t d = 0; d < hd; ++d) dx[d] = s * tau * dy[d];
  }
}
}  // namespace

void qk_norm_bwd(float* dq, float* dk, float* dtemp, const float* dqo, const float* dko, const float* q,
                 const float* k, const float* temp, int64_t N, int64_t nq, int64_t nkv, int64_t hd) {
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
  // dτ_j = Σ_n ⟨dk_out, x·s/max(n, ε)⟩: partial sums over fixed 256-row chunks (independent of the
  // thread count), added in chunk order afterwards.
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (N + kChunk - 1) / kChunk;
  std::vector<float> part(static_cast<size_t>(chunks * nkv), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    for (int64_t n = c * kChunk; n < std::min(N, (c + 1) * kChunk); ++n) {
      for (int64_t h = 0; h < nq; ++h) {
        int64_t off = (n * nq + h) * hd;
        norm_backward(dq + off, q + off, dqo + off, 1.0f, hd, sqrt_hd);
      }
      for (int64_t j = 0; j < nkv; ++j) {
        int64_t off = (n * nkv + j) * hd;
        norm_backward(dk + off, k + off, dko + off, temp[j], hd, sqrt_hd);
        part[c * nkv + j] += norm_scale(k + off, hd, sqrt_hd) * dotf(k + off, dko + off, hd);
      }
    }
  }
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t j = 0; j < nkv; ++j) dtemp[j] += part[c * nkv + j];
}

}  // namespace zaya::ops::cpu
