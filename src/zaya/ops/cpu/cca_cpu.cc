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

#include "zaya/ops/cpu/rope_cpu.h"
#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/cpu/tile_mm.h"

namespace zaya::ops::cpu {

namespace {

// The depthwise taps split into planar arrays (w0[c] = dw[c,0], w1[c] = dw[c,1]) so that 16
// channels of a tap are one vector load.
struct Taps {
  std::vector<float> w0, w1;
  Taps(const float* dw, int64_t C) : w0(static_cast<size_t>(C)), w1(static_cast<size_t>(C)) {
    for (int64_t c = 0; c < C; ++c) w0[c] = dw[2 * c], w1[c] = dw[2 * c + 1];
  }
};

// Depthwise slots s and s+1 of channels c0 .. c0+hd of one token, from its input rows z_{s-2},
// z_{s-1}, z_s (null: padding, read as zero):
//     d_s = fma(w1, z_{s-1}, fma(w0, z_{s-2}, db)),   d_{s+1} = fma(w1, z_s, fma(w0, z_{s-1}, db)).
// Interleaved (the forward and decode: the grouped weight's [i][tap] order) writes out[2i + tap];
// planar (the backward) writes out[tap·hd + i]. The forward and the decode step both come here, so
// they agree bit for bit.
template <bool Interleaved>
inline void depthwise_pair(float* out, const float* zm2, const float* zm1, const float* z0, int64_t c0,
                           int64_t hd, const Taps& w, const float* db) {
#if defined(__AVX512F__)
  const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (int64_t i = 0; i < hd; i += 16) {
    const __mmask16 m = first_lanes(hd - i);
    const int64_t c = c0 + i;
    const __m512 a = zm2 ? _mm512_maskz_loadu_ps(m, zm2 + c) : _mm512_setzero_ps();
    const __m512 p = zm1 ? _mm512_maskz_loadu_ps(m, zm1 + c) : _mm512_setzero_ps();
    const __m512 n = z0 ? _mm512_maskz_loadu_ps(m, z0 + c) : _mm512_setzero_ps();
    const __m512 w0 = _mm512_maskz_loadu_ps(m, w.w0.data() + c), w1 = _mm512_maskz_loadu_ps(m, w.w1.data() + c);
    const __m512 b = _mm512_maskz_loadu_ps(m, db + c);
    const __m512 d0 = _mm512_fmadd_ps(w1, p, _mm512_fmadd_ps(w0, a, b));
    const __m512 d1 = _mm512_fmadd_ps(w1, n, _mm512_fmadd_ps(w0, p, b));
    if constexpr (Interleaved) {
      const int64_t n2 = 2 * std::min<int64_t>(16, hd - i);
      _mm512_mask_storeu_ps(out + 2 * i, first_lanes(n2), _mm512_permutex2var_ps(d0, lo_idx, d1));
      _mm512_mask_storeu_ps(out + 2 * i + 16, first_lanes(n2 - 16), _mm512_permutex2var_ps(d0, hi_idx, d1));
    } else {
      _mm512_mask_storeu_ps(out + i, m, d0);
      _mm512_mask_storeu_ps(out + hd + i, m, d1);
    }
  }
#elif ZAYA_AVX2
  for (int64_t i = 0; i < hd; i += 8) {
    const __m256i m = first_lanes8(hd - i);
    const int64_t c = c0 + i;
    const __m256 a = zm2 ? _mm256_maskload_ps(zm2 + c, m) : _mm256_setzero_ps();
    const __m256 p = zm1 ? _mm256_maskload_ps(zm1 + c, m) : _mm256_setzero_ps();
    const __m256 n = z0 ? _mm256_maskload_ps(z0 + c, m) : _mm256_setzero_ps();
    const __m256 w0 = _mm256_maskload_ps(w.w0.data() + c, m), w1 = _mm256_maskload_ps(w.w1.data() + c, m);
    const __m256 b = _mm256_maskload_ps(db + c, m);
    const __m256 d0 = _mm256_fmadd_ps(w1, p, _mm256_fmadd_ps(w0, a, b));
    const __m256 d1 = _mm256_fmadd_ps(w1, n, _mm256_fmadd_ps(w0, p, b));
    if constexpr (Interleaved) {  // [d0_0 d1_0 d0_1 d1_1 ...]: unpack within 128-bit lanes, then join
      const __m256 lo = _mm256_unpacklo_ps(d0, d1), hi = _mm256_unpackhi_ps(d0, d1);
      const int64_t n2 = 2 * std::min<int64_t>(8, hd - i);
      _mm256_maskstore_ps(out + 2 * i, first_lanes8(n2), _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_maskstore_ps(out + 2 * i + 8, first_lanes8(n2 - 8), _mm256_permute2f128_ps(lo, hi, 0x31));
    } else {
      _mm256_maskstore_ps(out + i, m, d0);
      _mm256_maskstore_ps(out + hd + i, m, d1);
    }
  }
#else
  for (int64_t i = 0; i < hd; ++i) {
    const int64_t c = c0 + i;
    const float a = zm2 ? zm2[c] : 0.0f, p = zm1 ? zm1[c] : 0.0f, n = z0 ? z0[c] : 0.0f;
    const float d0 = std::fma(w.w1[c], p, std::fma(w.w0[c], a, db[c]));
    const float d1 = std::fma(w.w1[c], n, std::fma(w.w0[c], p, db[c]));
    if constexpr (Interleaved) out[2 * i] = d0, out[2 * i + 1] = d1;
    else out[i] = d0, out[hd + i] = d1;
  }
#endif
}

// The input rows of token (b, s): z_{s-2}, z_{s-1}, z_s of its own sequence row, null before it.
struct TokenRows {
  const float *zm2, *zm1, *z0;
};
inline TokenRows token_rows(const float* z, int64_t bt, int64_t T, int64_t C) {
  const float* zb = z + (bt / T) * T * C;
  const int64_t s = bt % T;
  return {s >= 2 ? zb + (s - 2) * C : nullptr, s >= 1 ? zb + (s - 1) * C : nullptr, zb + s * C};
}

// Grouped conv of one head for one token from its interleaved depthwise pair: the definition (and
// the decode step, and the forward without AVX-512).
inline void grouped_head(float* out, const float* dd, int64_t c0, int64_t hd, const float* gw, const float* gb) {
  for (int64_t o = c0; o < c0 + hd; ++o) out[o] = gb[o] + dotf(gw + o * 2 * hd, dd, 2 * hd);
}

constexpr int64_t kRows = 64;  // tokens per forward task
constexpr int64_t kTok = 64;   // tokens per backward block: its depthwise pairs and E rows stay in L1/L2

// The blocked forwards' inputs: the depthwise rows below (AVX-512 and AVX2) and, for the AVX2
// form's dot products, the grouped weight's rows copied to 64-byte-aligned rows of K2p, zero-padded
// like dd's: the products past K2 are 0·0 = +0, which leaves every partial sum's bits as dotf's, and
// the loop needs no masks (the parameter views are not aligned to a cache line).
[[maybe_unused]] AlignedVector<float> padded_weight_rows(const float* gw, int64_t C, int64_t K2, int64_t K2p) {
  AlignedVector<float> gwa(static_cast<size_t>(C * K2p), 0.0f);
  for (int64_t o = 0; o < C; ++o) std::copy_n(gw + o * K2, K2, gwa.data() + o * K2p);
  return gwa;
}

// dd rows [0, nr) = the interleaved depthwise pairs of head g for tokens r0.., zero-padded to K2p;
// rows [nr, nr4) all zero (past the block's end: computed, never stored).
[[maybe_unused]] void depthwise_rows(float* dd, int64_t K2p, const float* z, int64_t r0, int64_t nr, int64_t nr4,
                                     int64_t T, int64_t C, int64_t g, int64_t hd, const Taps& taps, const float* db) {
  for (int64_t r = 0; r < nr4; ++r) {
    float* d = dd + r * K2p;
    if (r < nr) {
      const TokenRows zr = token_rows(z, r0 + r, T, C);
      depthwise_pair<true>(d, zr.zm2, zr.zm1, zr.z0, g * hd, hd, taps, db);
      std::fill(d + 2 * hd, d + K2p, 0.0f);
    } else {
      std::fill(d, d + K2p, 0.0f);
    }
  }
}

}  // namespace

// Forward: out_t[o] = gb[o] + dotf(gw[o, :, :], dd_t) per head, dd_t the interleaved depthwise pair.
// The summation order is dotf's. It was kept when the HF parity test compared against HF in fp32:
// the qk_norm temperature's gradient downstream is ill-conditioned, and a single FMA chain over the
// 2·hd inputs moved it 1.3e-4 from HF's fp32 value (2e-5 with this order). The test now compares
// against HF in float64 with a bound of max(1e-4, 10× torch's own fp32 error) per tensor, which may
// admit the single chain (not rerun): a single chain through tile_mm measured only 1.03–1.10×
// faster (`bench_ops_attention` CcaConvForward, 8 alternations), so the partial-sum
// tree is not what bounds this kernel, and the order stays. dotf keeps 16 partial sums, lane
// l an FMA chain over the inputs k ≡ l (mod 16) (zero-padded to whole 16s, which adds exact zeros),
// then adds them in sum16's tree. The decode step calls dotf itself, and
// CcaConv.DecodeEqualsFullForwardAtEveryPosition checks it against this forward bitwise.
// With AVX-512 the chains run as outer products, outputs across the lanes: for each class l,
// P_l[t][o] = Σ_j dd_t[16j+l]·gw[o][16j+l] (an FMA chain in j, from zero) for 4 tokens × 64
// outputs in 16 registers, the weight transposed to [input][output] so 16 outputs are one load and
// the token's input one broadcast; sum16_lanes then adds the 16 P_l in sum16's tree, 15 vector
// adds for 16 outputs instead of dot products' horizontal sums (1.4–1.5× the per-output dot form at
// the demo's shape on a Zen 4, the same bits).
void cca_conv_fwd(float* out, const float* z, const float* dw, const float* db, const float* gw,
                  const float* gb, int64_t B, int64_t T, int64_t heads, int64_t hd) {
  const int64_t C = heads * hd, N = B * T, K2 = 2 * hd;
  const Taps taps(dw, C);
#if defined(__AVX512F__)
  const int64_t nblk = (N + kRows - 1) / kRows;
  const int64_t J = (K2 + 15) / 16, K2p = 16 * J;  // chain length; dd rows padded with zeros to K2p
  constexpr int64_t kOut = 64;                     // outputs per pass: 4 vectors
  const int64_t hdp = (hd + kOut - 1) / kOut * kOut;
  // gwt[g][i][o] = gw[g·hd + o][i] for i < K2, o < hd; zero past them (computed, never stored).
  AlignedVector<float> gwt(static_cast<size_t>(heads * K2p * hdp), 0.0f);
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t o = 0; o < hd; ++o)
      for (int64_t i = 0; i < K2; ++i) gwt[(g * K2p + i) * hdp + o] = gw[(g * hd + o) * K2 + i];
#pragma omp parallel
  {
    float* dd = scratch<0>(kRows * K2p);
    float* part = scratch<1>(16 * 4 * kOut);  // P_l of 4 tokens × kOut outputs: [l][token][output]
#pragma omp for schedule(dynamic, 1)  // tasks own their outputs (docs/CONTRIBUTING.md, "Adding an op")
    for (int64_t task = 0; task < nblk * heads; ++task) {
      const int64_t g = task % heads, r0 = (task / heads) * kRows, nr = std::min(kRows, N - r0);
      const int64_t nr4 = (nr + 3) / 4 * 4;
      depthwise_rows(dd, K2p, z, r0, nr, nr4, T, C, g, hd, taps, db);
      const float* wg = gwt.data() + g * K2p * hdp;
      for (int64_t r4 = 0; r4 < nr; r4 += 4) {
        const float* x = dd + r4 * K2p;
        for (int64_t o0 = 0; o0 < hd; o0 += kOut) {
          for (int64_t l = 0; l < 16; ++l) {
            __m512 a[4][4];
            for (auto& row : a)
              for (__m512& v : row) v = _mm512_setzero_ps();
            for (int64_t j = 0; j < J; ++j) {
              const int64_t i = 16 * j + l;
              const float* wi = wg + i * hdp + o0;
              __m512 w[4];
              for (int v = 0; v < 4; ++v) w[v] = _mm512_load_ps(wi + 16 * v);
              for (int r = 0; r < 4; ++r) {
                const __m512 xv = _mm512_set1_ps(x[r * K2p + i]);
                for (int v = 0; v < 4; ++v) a[r][v] = _mm512_fmadd_ps(w[v], xv, a[r][v]);
              }
            }
            for (int r = 0; r < 4; ++r)
              for (int v = 0; v < 4; ++v) _mm512_store_ps(part + (l * 4 + r) * kOut + 16 * v, a[r][v]);
          }
          for (int64_t r = 0; r < std::min<int64_t>(4, nr - r4); ++r)
            for (int64_t v = 0; v < kOut && o0 + v < hd; v += 16) {
              const __m512 sum = sum16_lanes(part + r * kOut + v, 4 * kOut);
              const __mmask16 mo = first_lanes(hd - o0 - v);
              const __m512 bias = _mm512_maskz_loadu_ps(mo, gb + g * hd + o0 + v);
              _mm512_mask_storeu_ps(out + (r0 + r4 + r) * C + g * hd + o0 + v, mo, _mm512_add_ps(bias, sum));
            }
        }
      }
    }
  }
#elif ZAYA_AVX2
  // The AVX-512 form's blocking on 8-lane registers: each output's 16 partial sums are two
  // registers, lanes 0-7 and 8-15 of every 16 inputs, run as two passes over the inputs (4 tokens
  // × 2 outputs, 8 accumulators each); sum16_x8 then adds 8 outputs' partials in sum16's tree.
  const int64_t nblk = (N + kRows - 1) / kRows;
  const int64_t J = (K2 + 15) / 16, K2p = 16 * J;
  const AlignedVector<float> gwa = padded_weight_rows(gw, C, K2, K2p);
#pragma omp parallel
  {
    float* dd = scratch<0>(kRows * K2p);
    float* acc = scratch<1>(4 * 8 * 16);  // [token][output][lane] of 4 tokens × 8 outputs
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nblk * heads; ++task) {
      const int64_t g = task % heads, r0 = (task / heads) * kRows, nr = std::min(kRows, N - r0);
      const int64_t nr4 = (nr + 3) / 4 * 4;
      depthwise_rows(dd, K2p, z, r0, nr, nr4, T, C, g, hd, taps, db);
      for (int64_t r4 = 0; r4 < nr; r4 += 4) {
        const float* x = dd + r4 * K2p;
        for (int64_t o0 = 0; o0 < hd; o0 += 8) {
          for (int64_t og = 0; og < 8; og += 2) {
            const float* wr[2];  // outputs past hd reuse the last row: computed, never stored
            for (int q = 0; q < 2; ++q) wr[q] = gwa.data() + (g * hd + std::min(o0 + og + q, hd - 1)) * K2p;
            for (int64_t half = 0; half < 16; half += 8) {
              __m256 a[4][2];
              for (auto& row : a)
                for (__m256& v : row) v = _mm256_setzero_ps();
              for (int64_t j = 0; j < J; ++j) {
                const __m256 w0 = _mm256_load_ps(wr[0] + 16 * j + half), w1 = _mm256_load_ps(wr[1] + 16 * j + half);
                for (int r = 0; r < 4; ++r) {
                  const __m256 xv = _mm256_load_ps(x + r * K2p + 16 * j + half);
                  a[r][0] = _mm256_fmadd_ps(w0, xv, a[r][0]);
                  a[r][1] = _mm256_fmadd_ps(w1, xv, a[r][1]);
                }
              }
              for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 2; ++q) _mm256_storeu_ps(acc + (r * 8 + og + q) * 16 + half, a[r][q]);
            }
          }
          const __m256i mo = first_lanes8(hd - o0);
          const __m256 bias = _mm256_maskload_ps(gb + g * hd + o0, mo);
          for (int64_t r = 0; r < std::min<int64_t>(4, nr - r4); ++r)
            _mm256_maskstore_ps(out + (r0 + r4 + r) * C + g * hd + o0, mo, _mm256_add_ps(bias, sum16_x8(acc + r * 128)));
        }
      }
    }
  }
#else
#pragma omp parallel
  {
    float* dd = scratch<0>(K2);
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < N; ++bt) {
      const TokenRows zr = token_rows(z, bt, T, C);
      for (int64_t g = 0; g < heads; ++g) {
        depthwise_pair<true>(dd, zr.zm2, zr.zm1, zr.z0, g * hd, hd, taps, db);
        grouped_head(out + bt * C, dd, g * hd, hd, gw, gb);
      }
    }
  }
#endif
}

// Backward, one task per (head, batch row): a sequence's steps are chained (G_{s-1} and E_{s-1}[1]
// carry from token to token), sequences are not, so the B·heads tasks share out evenly however
// fast each thread runs (one task per head, 6 for the demo, left the faster of two unequal vCPUs
// idle for up to a task). In a planar layout, per token, [tap][i]:
// gwp[o][tap][i] = gw[o][i][tap], dd[n][tap][i] = d_{t+tap}[g·hd + i]. Per block of kTok tokens:
//   dgw_g += doutᵀ · dd  (one FMA chain per element over the row's tokens),
//   E = dout · gwp       (E[n][tap][i]: the gradient reaching depthwise slot t+tap),
// and then elementwise, 16 channels per vector, over the block's s in order:
//   G_s      = E_s[0] + E_{s-1}[1]           (total gradient of depthwise slot s, s ∈ [0, T])
//   ddb += G_s, ddw[·,0] += G_s·z_{s-2}, ddw[·,1] += G_s·z_{s-1},
//   dz_t (+)= G_{t+1}·dw[·,1] + G_{t+2}·dw[·,0],  dgb += dout_t,
// with G_{s-1} and E_{s-1}[1] carried from block to block. Each task's weight and bias sums start
// from zero in its own slot; they are then added to the gradients row by row in batch order, so
// every result is bitwise the same for any thread count.
void cca_conv_bwd(float* dz, float* ddw, float* ddb, float* dgw, float* dgb, const float* dout,
                  const float* z, const float* dw, const float* db, const float* gw, int64_t B, int64_t T,
                  int64_t heads, int64_t hd, bool accumulate_dz) {
  const int64_t C = heads * hd, K2 = 2 * hd;
  std::vector<float> gwp(static_cast<size_t>(C * K2));
  for (int64_t o = 0; o < C; ++o)
    for (int64_t i = 0; i < hd; ++i)
      for (int64_t tap = 0; tap < 2; ++tap) gwp[o * K2 + tap * hd + i] = gw[o * K2 + 2 * i + tap];
  const Taps taps(dw, C);
  // Per task (g, b) = g·B + b: its dgw block [hd][2·hd] (planar), then ddb, ddw[·,0], ddw[·,1], dgb.
  const int64_t slot = hd * K2 + 4 * hd;
  float* part = scratch<4>(heads * B * slot);  // the calling thread's: shared by the team below
#pragma omp parallel
  {
    float* dd = scratch<2>(kTok * K2);
    float* E = scratch<3>(kTok * K2);
    float* state = scratch<5>(2 * hd);  // carried G_{s-1} and E_{s-1}[1] per channel of the head
    float *Gp = state, *E1 = state + hd;
#pragma omp for schedule(dynamic, 1)  // a task's outputs are its own: any thread may take it
    for (int64_t task = 0; task < heads * B; ++task) {
      const int64_t g = task / B, b = task % B, c0 = g * hd;
      float* dgwp = part + task * slot;
      float *sdb = dgwp + hd * K2, *sw0 = sdb + hd, *sw1 = sw0 + hd, *sgb = sw1 + hd;
      std::fill(sdb, sdb + 4 * hd, 0.0f);
      std::fill(Gp, Gp + 2 * hd, 0.0f);  // G_{-1} and E_{-1}[1]: nothing before the sequence
      const float* zb = z + b * T * C + c0;
      const float* doutb = dout + b * T * C + c0;
      float* dzb = dz + b * T * C + c0;
      // One elementwise step at slot s (s ≤ T+1) from G_s; 16 channels [i, i+16) of the head.
      auto step = [&](int64_t s, int64_t i, VecF G, VecF& gp, VecF& s_db, VecF& s_w0, VecF& s_w1, VecF w0,
                      VecF w1, int64_t n) {
        if (s <= T) {
          const VecF a = s >= 2 ? VecF::load(zb + (s - 2) * C + i, n) : VecF::zero();
          const VecF p = s >= 1 ? VecF::load(zb + (s - 1) * C + i, n) : VecF::zero();
          s_db = s_db + G;
          s_w0 = fma(G, a, s_w0);
          s_w1 = fma(G, p, s_w1);
        }
        if (s >= 2) {
          float* dzp = dzb + (s - 2) * C + i;
          const VecF g = fma(G, w0, gp * w1);
          (accumulate_dz ? VecF::load(dzp, n) + g : g).store(dzp, n);
        }
        gp = G;
      };
      for (int64_t t0 = 0; t0 < T; t0 += kTok) {
        const int64_t nt = std::min(kTok, T - t0), n0 = b * T + t0;
        for (int64_t r = 0; r < nt; ++r) {
          const TokenRows zr = token_rows(z, n0 + r, T, C);
          depthwise_pair<false>(dd + r * K2, zr.zm2, zr.zm1, zr.z0, c0, hd, taps, db);
        }
        mm(dgwp, K2, dout + n0 * C + c0, 1, C, dd, K2, hd, K2, nt, t0 > 0);
        mm(E, K2, dout + n0 * C + c0, C, 1, gwp.data() + c0 * K2, K2, nt, K2, hd, false);
        for (int64_t i = 0; i < hd; i += VecF::kLanes) {
          const int64_t n = std::min<int64_t>(VecF::kLanes, hd - i);
          VecF gp = VecF::load(Gp + i, n), e1 = VecF::load(E1 + i, n), s_db = VecF::load(sdb + i, n),
               s_w0 = VecF::load(sw0 + i, n), s_w1 = VecF::load(sw1 + i, n), s_gb = VecF::load(sgb + i, n);
          const VecF w0 = VecF::load(taps.w0.data() + c0 + i, n), w1 = VecF::load(taps.w1.data() + c0 + i, n);
          for (int64_t r = 0; r < nt; ++r) {
            const int64_t s = t0 + r;
            const VecF G = VecF::load(E + r * K2 + i, n) + e1;
            e1 = VecF::load(E + r * K2 + hd + i, n);
            step(s, i, G, gp, s_db, s_w0, s_w1, w0, w1, n);
            s_gb = s_gb + VecF::load(doutb + s * C + i, n);
          }
          if (t0 + nt == T) {  // the sequence's end: slot T (G = E_{T-1}[1]) and T+1 (G = 0) for dz
            step(T, i, VecF::zero() + e1, gp, s_db, s_w0, s_w1, w0, w1, n);
            step(T + 1, i, VecF::zero(), gp, s_db, s_w0, s_w1, w0, w1, n);
          }
          gp.store(Gp + i, n), e1.store(E1 + i, n), s_db.store(sdb + i, n), s_w0.store(sw0 + i, n);
          s_w1.store(sw1 + i, n), s_gb.store(sgb + i, n);
        }
      }
    }
    // The gradients, each element adding the batch rows' sums in row order.
#pragma omp for schedule(static)
    for (int64_t o = 0; o < C; ++o) {
      const int64_t g = o / hd, oo = o % hd;
      const float* p0 = part + g * B * slot;
      for (int64_t b = 0; b < B; ++b) {
        const float* pb = p0 + b * slot;
        const float* row = pb + oo * K2;
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t tap = 0; tap < 2; ++tap) dgw[o * K2 + 2 * i + tap] += row[tap * hd + i];
        const float* sums = pb + hd * K2;
        ddb[o] += sums[oo];
        ddw[2 * o] += sums[hd + oo];
        ddw[2 * o + 1] += sums[2 * hd + oo];
        dgb[o] += sums[3 * hd + oo];
      }
    }
  }
}

void cca_conv_decode(float* out, float* state, const float* z, const float* dw, const float* db,
                     const float* gw, const float* gb, int64_t B, int64_t heads, int64_t hd) {
  const int64_t C = heads * hd;
  const Taps taps(dw, C);
  std::vector<float> dd(2 * hd);
  for (int64_t b = 0; b < B; ++b) {
    // The window [z_{t-2}, z_{t-1}, z_t]: slot t of the depthwise conv is d_t, slot t+1 is d_{t+1},
    // exactly what the full forward computes at position t.
    float* st = state + b * 2 * C;
    const float* zt = z + b * C;
    for (int64_t g = 0; g < heads; ++g) {
      depthwise_pair<true>(dd.data(), st, st + C, zt, g * hd, hd, taps, db);
      grouped_head(out + b * C, dd.data(), g * hd, hd, gw, gb);
    }
    std::copy(st + C, st + 2 * C, st);
    std::copy(zt, zt + C, st + C);
  }
}

namespace {

// One token's mean skip: rows q [nq·hd], k [nkv·hd] from its conv row cv [C] and q̃, k̃ rows.
inline void mean_skip_token(float* q, float* k, const float* cv, const float* qt, const float* kt, int64_t nq,
                            int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv;
  const float inv_g = 1.0f / static_cast<float>(G);
  for (int64_t j = 0; j < nkv; ++j) {
    const float* kj = kt + j * hd;
    float* ko = k + j * hd;
    for (int64_t d = 0; d < hd; ++d) ko[d] = 0.0f;  // running Σ_h m_q^h of group j
    for (int64_t h = j * G; h < (j + 1) * G; ++h) {
      const float* qh = qt + h * hd;
      float* qo = q + h * hd;
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

// One token's mean-skip backward (see mean_skip_bwd).
inline void mean_skip_token_bwd(float* dc, float* dqt, float* dkt, const float* dq, const float* dk, int64_t nq,
                                int64_t nkv, int64_t hd) {
  const int64_t G = nq / nkv;
  const float inv_g = 1.0f / static_cast<float>(G);
  for (int64_t j = 0; j < nkv; ++j) {
    const float* dkj = dk + j * hd;
    float* dktj = dkt + j * hd;
    for (int64_t d = 0; d < hd; ++d) {
      dc[(nq + j) * hd + d] = dkj[d];
      dktj[d] = 0.0f;
    }
    for (int64_t h = j * G; h < (j + 1) * G; ++h) {
      const float* dqh = dq + h * hd;
      float* dqth = dqt + h * hd;
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

}  // namespace

void mean_skip_fwd(float* q, float* k, const float* conv, const float* qt, const float* kt, int64_t N,
                   int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t C = (nq + nkv) * hd;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    mean_skip_token(q + n * nq * hd, k + n * nkv * hd, conv + n * C, qt + n * nq * hd, kt + n * nkv * hd, nq, nkv,
                    hd);
}

// dm_q^h = dq^h + dk^j / G;  dq̃^h = ½ dm_q^h;  dk̃^j = ½ Σ_{h in j} dm_q^h;  dconv = [dq, dk].
void mean_skip_bwd(float* dconv, float* dqt, float* dkt, const float* dq, const float* dk, int64_t N,
                   int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t C = (nq + nkv) * hd;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    mean_skip_token_bwd(dconv + n * C, dqt + n * nq * hd, dkt + n * nkv * hd, dq + n * nq * hd, dk + n * nkv * hd,
                        nq, nkv, hd);
}

// Rows of 2·half: [vc_t | vd_t] in, [vc_t | vd_{t-1}] out.
void value_shift_fwd(float* v, const float* vcd, int64_t B, int64_t T, int64_t half) {
  const int64_t w = 2 * half;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    float* vo = v + bt * w;
    std::copy_n(vcd + bt * w, half, vo);
    if (bt % T == 0)
      std::fill_n(vo + half, half, 0.0f);  // vd_{-1} = 0 at each row's start
    else
      std::copy_n(vcd + (bt - 1) * w + half, half, vo + half);
  }
}

void value_shift_bwd(float* dvcd, const float* dv, int64_t B, int64_t T, int64_t half) {
  const int64_t w = 2 * half;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    float* d = dvcd + bt * w;
    std::copy_n(dv + bt * w, half, d);
    // vd_t feeds v_{t+1}; the last token's vd is used by no one (in this sequence).
    if (bt % T == T - 1)
      std::fill_n(d + half, half, 0.0f);
    else
      std::copy_n(dv + (bt + 1) * w + half, half, d + half);
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

// One token's QK norm: rows q [nq·hd], k [nkv·hd] → qo, ko.
inline void qk_norm_token(float* qo, float* ko, const float* q, const float* k, const float* temp, int64_t nq,
                          int64_t nkv, int64_t hd, float sqrt_hd) {
  for (int64_t h = 0; h < nq; ++h) {
    const float* x = q + h * hd;
    float* y = qo + h * hd;
    float s = norm_scale(x, hd, sqrt_hd);
    for (int64_t d = 0; d < hd; ++d) y[d] = x[d] * s;
  }
  for (int64_t j = 0; j < nkv; ++j) {
    const float* x = k + j * hd;
    float* y = ko + j * hd;
    float s = norm_scale(x, hd, sqrt_hd);
    for (int64_t d = 0; d < hd; ++d) y[d] = (x[d] * s) * temp[j];
  }
}
}  // namespace

void qk_norm_fwd(float* qo, float* ko, const float* q, const float* k, const float* temp, int64_t N,
                 int64_t nq, int64_t nkv, int64_t hd) {
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    qk_norm_token(qo + n * nq * hd, ko + n * nkv * hd, q + n * nq * hd, k + n * nkv * hd, temp, nq, nkv, hd,
                  sqrt_hd);
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

// One token's QK-norm backward: dq, dk written; part[j] += its term of dτ_j.
inline void qk_norm_token_bwd(float* dq, float* dk, float* part, const float* dqo, const float* dko, const float* q,
                              const float* k, const float* temp, int64_t nq, int64_t nkv, int64_t hd,
                              float sqrt_hd) {
  for (int64_t h = 0; h < nq; ++h) norm_backward(dq + h * hd, q + h * hd, dqo + h * hd, 1.0f, hd, sqrt_hd);
  for (int64_t j = 0; j < nkv; ++j) {
    const int64_t off = j * hd;
    norm_backward(dk + off, k + off, dko + off, temp[j], hd, sqrt_hd);
    part[j] += norm_scale(k + off, hd, sqrt_hd) * dotf(k + off, dko + off, hd);
  }
}

// dτ_j = Σ_n ⟨dk_out, x·s/max(n, ε)⟩: partial sums over fixed 256-row chunks (independent of the
// thread count), added in chunk order afterwards.
constexpr int64_t kTempChunk = 256;
void add_temp_partials(float* dtemp, const std::vector<float>& part, int64_t nkv) {
  for (size_t c = 0; c < part.size() / static_cast<size_t>(nkv); ++c)
    for (int64_t j = 0; j < nkv; ++j) dtemp[j] += part[c * nkv + j];
}
}  // namespace

void qk_norm_bwd(float* dq, float* dk, float* dtemp, const float* dqo, const float* dko, const float* q,
                 const float* k, const float* temp, int64_t N, int64_t nq, int64_t nkv, int64_t hd) {
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
  const int64_t chunks = (N + kTempChunk - 1) / kTempChunk;
  std::vector<float> part(static_cast<size_t>(chunks * nkv), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t n = c * kTempChunk; n < std::min(N, (c + 1) * kTempChunk); ++n) {
      const int64_t oq = n * nq * hd, ok = n * nkv * hd;
      qk_norm_token_bwd(dq + oq, dk + ok, part.data() + c * nkv, dqo + oq, dko + ok, q + oq, k + ok, temp, nq, nkv,
                        hd, sqrt_hd);
    }
  add_temp_partials(dtemp, part, nkv);
}

// The q/k path fused per token: each token's rows go through mean skip, QK norm and RoPE while
// they are in L1, in one parallel loop instead of four passes over [N, ·] tensors. Each step is the
// per-token function the separate ops use, in the same order, so the results are theirs bit for bit.
void cca_qk_fwd(float* qr, float* kr, float* qpre, float* kpre, const float* conv, const float* z, const float* temp,
                const float* cos, const float* sin, int64_t rot, int64_t B, int64_t T, int64_t nq, int64_t nkv,
                int64_t hd) {
  const int64_t C = (nq + nkv) * hd, rq = nq * hd, rk = nkv * hd, half = rot / 2;
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < B * T; ++n) {
    const int64_t pos = n % T;
    const float* zn = z + n * C;  // [q̃ | k̃] of this token
    mean_skip_token(qpre + n * rq, kpre + n * rk, conv + n * C, zn, zn + rq, nq, nkv, hd);
    qk_norm_token(qr + n * rq, kr + n * rk, qpre + n * rq, kpre + n * rk, temp, nq, nkv, hd, sqrt_hd);
    rope_token(qr + n * rq, qr + n * rq, cos + pos * half, sin + pos * half, rot, nq, hd, 1.0f);
    rope_token(kr + n * rk, kr + n * rk, cos + pos * half, sin + pos * half, rot, nkv, hd, 1.0f);
  }
}

// Backward of cca_qk_fwd: inverse RoPE into per-thread rows, QK-norm backward, mean-skip backward.
// The QK norm's dq, dk never leave the thread; dτ's partial sums use qk_norm_bwd's chunks and order.
void cca_qk_bwd(float* dconv, float* dz, float* dtemp, const float* dqr, const float* dkr,
                const float* qpre, const float* kpre, const float* temp, const float* cos, const float* sin,
                int64_t rot, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t N = B * T, C = (nq + nkv) * hd, rq = nq * hd, rk = nkv * hd, half = rot / 2;
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
  const int64_t chunks = (N + kTempChunk - 1) / kTempChunk;
  std::vector<float> part(static_cast<size_t>(chunks * nkv), 0.0f);
#pragma omp parallel
  {
    std::vector<float> rows(static_cast<size_t>(2 * (rq + rk)));
    float *gq = rows.data(), *gk = gq + rq, *dq = gk + rk, *dk = dq + rq;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t n = c * kTempChunk; n < std::min(N, (c + 1) * kTempChunk); ++n) {
        const int64_t pos = n % T;
        rope_token(gq, dqr + n * rq, cos + pos * half, sin + pos * half, rot, nq, hd, -1.0f);
        rope_token(gk, dkr + n * rk, cos + pos * half, sin + pos * half, rot, nkv, hd, -1.0f);
        qk_norm_token_bwd(dq, dk, part.data() + c * nkv, gq, gk, qpre + n * rq, kpre + n * rk, temp, nq, nkv, hd,
                          sqrt_hd);
        mean_skip_token_bwd(dconv + n * C, dz + n * C, dz + n * C + rq, dq, dk, nq, nkv, hd);
      }
  }
  add_temp_partials(dtemp, part, nkv);
}

}  // namespace zaya::ops::cpu
