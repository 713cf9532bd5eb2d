// The fused tied head (see tied_head_cpu.h for the layout and why).
#include "zaya/ops/cpu/tied_head_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "zaya/core/error.h"
#include "zaya/ops/cpu/seq_vec.h"

namespace zaya::ops::cpu {

// Floats from one strip to the next: every token's 16-float row, tokens rounded up to 16. (One
// extra tile per strip, to keep strips 128 KiB apart off the same cache sets, measured 0.97× on
// the demo head: tools/bench_ab.py, 8 rounds, 0.88–1.12.)
namespace {
int64_t strip_stride(int64_t n) { return (n + 15) / 16 * 256; }

// The forward's vocabulary blocks: 2 strips (32 rows), the columns of one register block.
constexpr int64_t kStripsPerBlock = 2;
int64_t vocab_blocks(int64_t vocab) {
  const int64_t strips = (vocab + 15) / 16;
  return (strips + kStripsPerBlock - 1) / kStripsPerBlock;
}
int64_t block_state_elems(int64_t n, int64_t vocab) { return (n + 15) / 16 * 16 * vocab_blocks(vocab); }
}  // namespace

// e's strips, then [vocab block][token] of the block maxima (becoming the scales) and block sums.
int64_t tied_head_strip_elems(int64_t n, int64_t vocab) {
  return strip_stride(n) * ((vocab + 15) / 16) + 2 * block_state_elems(n, vocab);
}

#if defined(__AVX512F__)

bool tied_head_fused_built() { return true; }

// A 16 × 16 tile of C (tied_head_cpu.h): C[i·ldc + j] (+)= Σ_k a[k·16 + i] · b[k·16 + j] over
// k < kc for rows i < rows and the columns in `cols`, both operands k-major panels 16 wide. One FMA chain per
// element in k order (16 accumulators, one B vector and one broadcast per step: the FMA unit's rate
// with the panels in L1/L2), continuing from C's value when accumulate. The backward's products.
// Continuing from C, rather than summing into a zeroed buffer and adding that to C, saves one load,
// add and store per row of C (~0.5% of the demo step; the head's backward 1.011–1.039× faster,
// tools/switch_ab.cc head, three runs of 30–40 pairs).
__attribute__((noinline)) void tile_panels(float* C, int64_t ldc, int64_t rows, __mmask16 cols,
                                           bool accumulate, const float* a, const float* b, int64_t kc) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i)
    acc[i] = accumulate && i < rows ? _mm512_maskz_loadu_ps(cols, C + i * ldc) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 bv = _mm512_load_ps(b + k * 16);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * 16 + i]), bv, acc[i]);
  }
  for (int i = 0; i < 16; ++i)
    if (i < rows) _mm512_mask_storeu_ps(C + i * ldc, cols, acc[i]);
}

namespace {

int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }
__mmask16 first_n(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Packed operands, per calling thread, kept between calls (about 10 MiB for the demo's head). (On
// the project's huge-page tensor storage instead, the demo step read 1.006× over 12 alternations:
// not worth tying this kernel file to the tensor library and, through it, the CUDA runtime.)
float* scratch(int64_t elems) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<float, Free> buf;
  thread_local int64_t have = 0;
  if (elems > have) {
    buf.reset(
        static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(round16(elems)) * sizeof(float))));
    ZAYA_CHECK(buf, "tied head: cannot allocate ", elems * 4, " bytes of packing scratch");
    have = elems;
  }
  return buf.get();
}

// dst[k·16 + i] = src[i·ld + k] for i < rows (0 for rows ≤ i < 16), k < kc: 16 rows of a row-major
// matrix as a k-major panel, 16 × 16 blocks transposed in registers.
void pack_rows_transposed(float* dst, const float* src, int64_t ld, int64_t rows, int64_t kc) {
  alignas(64) float block[256];
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    const __mmask16 m = first_n(kc - k0);
    for (int64_t i = 0; i < 16; ++i)
      _mm512_store_ps(block + i * 16,
                      i < rows ? _mm512_maskz_loadu_ps(m, src + i * ld + k0) : _mm512_setzero_ps());
    if (kc - k0 >= 16) {
      transpose16(dst + k0 * 16, 16, block, 16);
    } else {
      alignas(64) float t[256];
      transpose16(t, 16, block, 16);
      std::copy_n(t, (kc - k0) * 16, dst + k0 * 16);
    }
  }
}

// The same 16 rows as two k-major panels 8 wide: lo[k·8 + i] = src[i·ld + k] for i < 8 and
// hi[k·8 + i] = src[(8 + i)·ld + k] (0 past rows), for the forward's 8-token register blocks.
void pack_rows_transposed_halves(float* lo, float* hi, const float* src, int64_t ld, int64_t rows,
                                 int64_t kc) {
  alignas(64) float block[256], t[256];
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    const __mmask16 m = first_n(kc - k0);
    for (int64_t i = 0; i < 16; ++i)
      _mm512_store_ps(block + i * 16,
                      i < rows ? _mm512_maskz_loadu_ps(m, src + i * ld + k0) : _mm512_setzero_ps());
    transpose16(t, 16, block, 16);
    for (int64_t k = 0; k < std::min<int64_t>(16, kc - k0); ++k) {
      _mm256_store_ps(lo + (k0 + k) * 8, _mm256_load_ps(t + k * 16));
      _mm256_store_ps(hi + (k0 + k) * 8, _mm256_load_ps(t + k * 16 + 8));
    }
  }
}

// dst[p·ldp + r·16 + j] = scale_r · src[r·ld + 16p + j] for r < rows16, 16p + j < cols: a row-major
// [rows, cols] matrix as k-major panels of 16 columns (k = the row), 0 past rows or cols; scale
// null means 1. Called inside a parallel region: the rows are shared out among its threads.
void pack_column_panels(float* dst, int64_t ldp, const float* src, int64_t ld, int64_t rows, int64_t rows16,
                        int64_t cols, const float* scale) {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows16; ++r)
    for (int64_t p = 0; p < (cols + 15) / 16; ++p) {
      __m512 v = _mm512_setzero_ps();
      if (r < rows) {
        v = _mm512_maskz_loadu_ps(first_n(cols - p * 16), src + r * ld + p * 16);
        if (scale) v = _mm512_mul_ps(v, _mm512_set1_ps(scale[r]));
      }
      _mm512_store_ps(dst + p * ldp + r * 16, v);
    }
}

// dE's product runs in tasks of kStripGroup strips (their dE rows: 256 × hd floats, 256 KiB for
// hd = 256), each summing tokens in blocks of kTokenBlock: per block, the 16 column panels of r ⊙ h
// (hd · 256 floats, 256 KiB) are read from L2 by every strip of the task, each strip's 16 KiB
// piece stays in L1 across the panels, and the task's dE rows stay in L2 across the blocks. With
// the whole batch as one block (2048 tokens: r ⊙ h's 2 MiB of panels read from L3 once per strip)
// the loop alone ran at 107–114 GFLOP/s against 133–142 with 256-token blocks on one Intel Xeon
// core (tools/tile_loop_probe.cc de 2048 / de 256, 4 alternations; a Zen 4 sweep had short blocks
// slower, but in one pass over all of dE per block, not this layout, which is unmeasured there). Vocabulary rows per k block of dh's: the B block of all 16-column
// panels (hd · 256 floats, 256 KiB for hd = 256) stays in L2 while the token blocks pass over it,
// and a token block's transposed tiles (16 KiB) stay in L1 beside each 16 KiB B panel piece; with
// 512 rows (32 KiB, the L1 shared with 32 KiB pieces) the backward took 68–71 against 63–64 ms
// (tools/tied_head_probe.cc, best of 8, five alternations; the demo step 1.02×).
constexpr int64_t kTokenBlock = 256;
constexpr int64_t kStripGroup = 16;
constexpr int64_t kVocabBlock = 256;

// The forward's register block: 8 tokens (a k-major panel 8 wide, broadcast) × kStripsPerBlock
// strips of Eᵀ (32 vocabulary rows, vector loads): acc[i][v] = Σ_k h[t0 + i][k]·E[16(s0 + v) + lane][k],
// one FMA chain per element in k order from zero. The caller keeps one block's Eᵀ panels (32 KiB)
// in L1 while every token panel passes through; each call asks for the next call's panel (`next`,
// 8 KiB) into L1 meanwhile. 10 loads per 16 FMAs against the 16 × 16 tile's 17, with only 32 bytes
// per k step coming from L2. One Intel Xeon core, the loop alone (tools/tile_loop_probe.cc, three
// alternations): 158 GFLOP/s (`blocks 8`), 151–154 with the 8-token panels as halves of 16-wide
// ones (`blocks 16`), against 138 for the previous forward (`forward 512 2 prefetch`: 16 × 16
// tiles, tokens resident in groups of 32, Eᵀ's 8 MiB streamed from L3 once per group).
template <int NV>
__attribute__((always_inline)) inline void logits_block(__m512 (&acc)[8][kStripsPerBlock], const float* a,
                                                        const float* b, int64_t hd, const float* next) {
  for (int i = 0; i < 8; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < hd; ++k) {
    if (k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + k * 8), _MM_HINT_T0);
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + v * hd * 16 + k * 16);
    for (int i = 0; i < 8; ++i) {
      const __m512 x = _mm512_set1_ps(a[k * 8 + i]);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(x, bv[v], acc[i][v]);
    }
  }
}

// The 16-lane reductions of 8 rows at once, by halving: each step folds two vectors' halves into
// one (8 rows × 16 lanes → 8 rows × 1 in 23 shuffles and ops, against 8 per row alone). Result lane
// 4q holds row q's and lane 4q + 1 row 4 + q's. Masked forms with every lane selected: GCC 12's
// plain ones pass an undefined vector and warn.
inline __m512 vmax(__m512 a, __m512 b) { return _mm512_mask_max_ps(a, 0xFFFF, a, b); }
inline __m512 vadd(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
template <class Op>
inline __m512 reduce_8_rows(const __m512 (&x)[8], Op op) {
  __m512 y[4], z[2];
  for (int i = 0; i < 4; ++i)  // 256-bit halves: lanes 0-7 row 2i, 8-15 row 2i+1
    y[i] = op(_mm512_mask_shuffle_f32x4(x[2 * i], 0xFFFF, x[2 * i], x[2 * i + 1], 0x44),
              _mm512_mask_shuffle_f32x4(x[2 * i], 0xFFFF, x[2 * i], x[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // 128-bit quarters: quarter q row 4i + q
    z[i] = op(_mm512_mask_shuffle_f32x4(y[2 * i], 0xFFFF, y[2 * i], y[2 * i + 1], 0x88),
              _mm512_mask_shuffle_f32x4(y[2 * i], 0xFFFF, y[2 * i], y[2 * i + 1], 0xDD));
  // Within each quarter: [a0 b0 a1 b1] with a from z[0], b from z[1], then the two pairs folded.
  const __m512 w = op(_mm512_mask_unpacklo_ps(z[0], 0xFFFF, z[0], z[1]),
                      _mm512_mask_unpackhi_ps(z[0], 0xFFFF, z[0], z[1]));
  return op(w, _mm512_mask_permute_ps(w, 0xFFFF, w, 0x4E));
}
// Lane of row i in reduce_8_rows' result.
constexpr int kRowLane[8] = {0, 4, 8, 12, 1, 5, 9, 13};

// One register block's softmax part: per token row, its max m over the block's columns (columns
// past V are −inf), e = exp(logit − m) with values below tiny stored as 0 (padded token rows 0),
// streamed into the strips, and the block's Σe. The scale of the block against the row's max comes
// at the end of the forward (tied_head_forward), when every block's m is known.
template <int NV>
__attribute__((always_inline)) inline void block_exp(__m512 (&acc)[8][kStripsPerBlock], float* e,
                                                     int64_t strip, int64_t rows, __mmask16 last_cols,
                                                     float tiny, bool stream, float* bmax, float* bsum) {
  const FlushBelow flush{tiny};
  __m512 rowv[8];
  for (int i = 0; i < 8; ++i) {
    acc[i][NV - 1] = _mm512_mask_blend_ps(last_cols, _mm512_set1_ps(-INFINITY), acc[i][NV - 1]);
    rowv[i] = acc[i][0];
    for (int v = 1; v < NV; ++v) rowv[i] = vmax(rowv[i], acc[i][v]);
  }
  const __m512 m = reduce_8_rows(rowv, vmax);
  for (int i = 0; i < 8; ++i) {
    const __m512 mb = _mm512_mask_permutexvar_ps(m, 0xFFFF, _mm512_set1_epi32(kRowLane[i]), m);
    __m512 sum = _mm512_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      __m512 x = expf_nonpositive_v(_mm512_sub_ps(acc[i][v], mb));
      x = apply_post(flush, x);                // below tiny → 0, NaN kept
      if (i >= rows) x = _mm512_setzero_ps();  // padded rows: 0, for the products that read them
      if (stream)
        _mm512_stream_ps(e + v * strip + i * 16, x);
      else
        _mm512_storeu_ps(e + v * strip + i * 16, x);
      sum = _mm512_add_ps(sum, x);
    }
    rowv[i] = sum;
  }
  const __m512 sums = reduce_8_rows(rowv, vadd);
  const __m512i gather = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_mask_storeu_ps(bmax, 0xFF, _mm512_mask_permutexvar_ps(m, 0xFFFF, gather, m));
  _mm512_mask_storeu_ps(bsum, 0xFF, _mm512_mask_permutexvar_ps(sums, 0xFFFF, gather, sums));
}

}  // namespace

// logits = h·Eᵀ block by block of 32 vocabulary rows, each block's Eᵀ panels held in L1 while every
// token passes: Eᵀ is read once and h's packed panels (2 MiB for the demo) once per block, instead
// of Eᵀ's 8 MiB once per 32 tokens. The softmax cannot wait for a row's max over all V without a
// second pass over e (64 MiB), so each block keeps e relative to its own max m_b; at the end,
//     M = max_b m_b,   Σ = Σ_b exp(m_b − M) · Σe_b (in block order),
// and the block's scale c_b = exp(m_b − M) replaces m_b in the state: the backward multiplies e by
// it where it reads e (its scaled copies and transposes), so no pass rewrites e.
void tied_head_forward(float* e, float* row_max, float* row_sum, float* picked, const float* h,
                       const float* E, const int32_t* targets, int64_t n, int64_t hd, int64_t vocab,
                       float tiny) {
  const int64_t n16 = round16(n), strips = round16(vocab) / 16, tail = vocab - (strips - 1) * 16;
  const int64_t strip = strip_stride(n), nvb = vocab_blocks(vocab);
  float* bmax = e + strips * strip;  // [block][n16]
  float* bsum = bmax + nvb * n16;
  // Eᵀ as k-major panels, one per strip (bt[s·hd·16 + k·16 + j] = E[16s + j][k]), then h as k-major
  // panels of 8 tokens (ap[q·hd·8 + k·8 + i] = h[8q + i][k]), with room past the last for the
  // prefetch of the panel after it.
  float* bt = scratch(strips * hd * 16 + (n16 + 16) * hd);
  float* ap = bt + strips * hd * 16;
  const int64_t panels = n16 / 16;
  // e is written with streaming stores when 64-byte aligned: nothing reads it before the backward,
  // and it is far larger than the caches.
  const bool stream = reinterpret_cast<uintptr_t>(e) % 64 == 0;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 16)
    for (int64_t s = 0; s < strips; ++s)
      pack_rows_transposed(bt + s * hd * 16, E + s * 16 * hd, hd, std::min<int64_t>(16, vocab - s * 16), hd);
#pragma omp for schedule(dynamic, 8)
    for (int64_t p = 0; p < panels; ++p)
      pack_rows_transposed_halves(ap + 2 * p * hd * 8, ap + (2 * p + 1) * hd * 8, h + p * 16 * hd, hd,
                                  std::min<int64_t>(16, n - p * 16), hd);

    // Dynamic schedules here and below: every iteration writes only its own outputs, so the bits do
    // not depend on who runs it, and the two threads of a shared VM often run at different speeds
    // (a static split left one idle ~9% of the forward; docs/CONTRIBUTING.md, "Adding an op").
#pragma omp for schedule(dynamic, 1)
    for (int64_t vb = 0; vb < nvb; ++vb) {
      const int64_t s0 = vb * kStripsPerBlock, ns = std::min(kStripsPerBlock, strips - s0);
      const __mmask16 last_cols = s0 + ns == strips ? first_n(tail) : __mmask16(0xFFFF);
      const float* b = bt + s0 * hd * 16;
      __m512 acc[8][kStripsPerBlock];
      for (int64_t p8 = 0; p8 < 2 * panels; ++p8) {
        const int64_t t0 = p8 * 8, rows = std::min<int64_t>(8, n - t0);
        const float* a = ap + p8 * hd * 8;
        const float* next = a + hd * 8;  // the next call's panel, asked into L1 meanwhile
        float* et = e + s0 * strip + t0 * 16;
        if (ns == kStripsPerBlock) {
          logits_block<kStripsPerBlock>(acc, a, b, hd, next);
          block_exp<kStripsPerBlock>(acc, et, strip, rows, last_cols, tiny, stream, bmax + vb * n16 + t0,
                                     bsum + vb * n16 + t0);
        } else {
          logits_block<1>(acc, a, b, hd, next);
          block_exp<1>(acc, et, strip, rows, last_cols, tiny, stream, bmax + vb * n16 + t0,
                       bsum + vb * n16 + t0);
        }
      }
    }
    _mm_sfence();  // each thread's streaming stores are visible before anyone reads e

    // Per 16 tokens: M, the blocks' scales (over their maxima) and Σ in block order.
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t t0 = p * 16;
      __m512 M = _mm512_set1_ps(-INFINITY);
      for (int64_t vb = 0; vb < nvb; ++vb) M = vmax(M, _mm512_loadu_ps(bmax + vb * n16 + t0));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t vb = 0; vb < nvb; ++vb) {
        const __m512 c = expf_fast_v(_mm512_sub_ps(_mm512_loadu_ps(bmax + vb * n16 + t0), M));
        _mm512_storeu_ps(bmax + vb * n16 + t0, c);
        sum = _mm512_fmadd_ps(c, _mm512_loadu_ps(bsum + vb * n16 + t0), sum);
      }
      const __mmask16 real = first_n(n - t0);
      _mm512_mask_storeu_ps(row_max + t0, real, M);
      _mm512_mask_storeu_ps(row_sum + t0, real, sum);
    }
    // The target's logit: the same FMA chain over k as the register block's, so the same bits.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const int32_t tg = targets[t];
      if (tg < 0 || tg >= vocab) continue;
      float acc = 0.0f;
      for (int64_t k = 0; k < hd; ++k) acc = std::fma(h[t * hd + k], E[tg * hd + k], acc);
      picked[t] = acc;
    }
  }
}

namespace {

// p = e·c with values below tiny stored as 0. e ≥ tiny holds per block, but a block whose max lies
// far below the row's has a tiny scale c, and then so are its products: left in, they come out
// below float's normal range, in the scaling and in the GEMM's FMAs, which x86 runs through
// microcode assists (a random-weights head, logits spread over ±100, took 4× as long;
// docs/results/ops-cpu.md, "Fused LM-head cross-entropy: denormals").
inline __m512 scaled_flushed(__m512 e, __m512 c, FlushBelow flush) {
  return apply_post(flush, _mm512_mul_ps(e, c));
}

// e reaches the backward from memory (the forward streamed it past the caches), and each product
// reads it in pieces (a strip's 256 tokens for dE, a token block's tiles for dh) that the hardware
// prefetcher, seeing a new stream every 16 KiB, does not fetch ahead. So while a piece's 16 tile
// products run, the lines of the piece after it are requested into L2, a share per product: part
// `p` of `parts` of the `lines` 64-byte lines at `next` (lines `stride` floats apart; null: none).
// The head's backward 1.029× and 1.036× (tools/switch_ab.cc head, 30 pairs, 22 and 23 won), the
// whole demo step 1.007–1.021× (switch_ab step, three runs of 24 pairs, 13–20 won).
inline void prefetch_share(const float* next, int64_t stride, int64_t lines, int64_t p, int64_t parts) {
  if (next == nullptr) return;
  for (int64_t q = p * lines / parts; q < (p + 1) * lines / parts; ++q)
    _mm_prefetch(reinterpret_cast<const char*>(next + q * stride), _MM_HINT_T1);
}

}  // namespace

void tied_head_backward_gemms(float* dE, float* dh, const float* e, const float* h, const float* r,
                              const float* E, int64_t n, int64_t hd, int64_t vocab, float tiny) {
  const FlushBelow flush{tiny};
  const int64_t n16 = round16(n), v16 = round16(vocab), strips = v16 / 16, panels = round16(hd) / 16;
  const int64_t strip = strip_stride(n), rstride = n16 * 16;
  // k-major panels of the two right operands, 16 columns of hd each (0 past hd, n or V):
  // rh[p·n16·16 + t·16 + j] = r[t]·h[t][16p + j], ep[p·v16·16 + v·16 + j] = E[v][16p + j].
  // Per thread after them: dh's A panel (kVocabBlock · 16) and dE's scaled e piece (kTokenBlock · 16).
  const int64_t per_thread = (kVocabBlock + kTokenBlock) * 16;
  float* rh = scratch(panels * (n16 + v16) * 16 + per_thread * omp_get_max_threads());
  float* ep = rh + panels * rstride;
  // The forward's block scales: e·c[vb][t] is exp(logit − row max), vb = strip / kStripsPerBlock.
  const float* scale = e + strips * strip;
#pragma omp parallel
  {
    pack_column_panels(rh, rstride, h, hd, n, n16, hd, r);
    pack_column_panels(ep, v16 * 16, E, hd, vocab, v16, hd, nullptr);
    float* at = ep + panels * v16 * 16 + per_thread * omp_get_thread_num();  // dh's A panel
    float* es = at + kVocabBlock * 16;                                       // dE's scaled e piece
    // dE += eᵀ·rh: tile (strip s, panel p) runs over the tokens in blocks of kTokenBlock, each
    // element's FMA chain continuing from dE's value block after block in order (one task owns a
    // strip's rows: the same bits on any thread count).
#pragma omp for schedule(dynamic, 1)
    for (int64_t s0 = 0; s0 < strips; s0 += kStripGroup)
      for (int64_t t0 = 0; t0 < n16; t0 += kTokenBlock) {
        const int64_t kt = std::min(kTokenBlock, n16 - t0), s1 = std::min(strips, s0 + kStripGroup);
        for (int64_t s = s0; s < s1; ++s) {
          const int64_t rows = std::min<int64_t>(16, vocab - s * 16);
          // The piece this task reads next: the next strip's, or the group's first of the next
          // token block (kt or fewer tokens: one 64-byte line each).
          const float* next = s + 1 < s1               ? e + (s + 1) * strip + t0 * 16
                              : t0 + kTokenBlock < n16 ? e + s0 * strip + (t0 + kTokenBlock) * 16
                                                       : nullptr;
          // The strip's piece with its block's scales, once for the 16 panels that read it.
          const float* es_src = e + s * strip + t0 * 16;
          const float* cs = scale + (s / kStripsPerBlock) * n16 + t0;
          for (int64_t k = 0; k < kt; ++k)
            _mm512_store_ps(es + k * 16,
                            scaled_flushed(_mm512_loadu_ps(es_src + k * 16), _mm512_set1_ps(cs[k]), flush));
          for (int64_t p = 0; p < panels; ++p) {
            prefetch_share(next, 16, kt, p, panels);
            const __mmask16 cols = first_n(hd - p * 16);
            tile_panels(dE + s * 16 * hd + p * 16, hd, rows, cols, true, es, rh + p * rstride + t0 * 16, kt);
          }
        }
      }
    // dh = e·E: tile (token block b, panel p) runs over the vocabulary rows in blocks of
    // kVocabBlock, the first block writing dh and the others continuing each element's chain.
    for (int64_t v0 = 0; v0 < v16; v0 += kVocabBlock) {
      const int64_t kv = std::min(kVocabBlock, v16 - v0);
#pragma omp for schedule(dynamic, 2)
      for (int64_t b = 0; b < n16 / 16; ++b) {
        const int64_t rows = std::min<int64_t>(16, n - b * 16);
        // This block's tiles as one k-major panel: broadcasting straight from the tiles (16 loads
        // from 16 lines at the same offset per k) ran at ~190 instead of ~200 GFLOP/s.
        for (int64_t s = 0; s < kv / 16; ++s) {  // with the strip's block scales for these 16 tokens
          transpose16(at + s * 256, 16, e + (v0 / 16 + s) * strip + b * 256, 16);
          const __m512 c = _mm512_loadu_ps(scale + ((v0 / 16 + s) / kStripsPerBlock) * n16 + b * 16);
          for (int64_t k = 0; k < 16; ++k)
            _mm512_store_ps(at + s * 256 + k * 16,
                            scaled_flushed(_mm512_load_ps(at + s * 256 + k * 16), c, flush));
        }
        // The next token block's tiles (kv/16 tiles of 16 lines; a thread usually takes it next:
        // the schedule hands out pairs of blocks).
        const float* next = b + 1 < n16 / 16 ? e + (v0 / 16) * strip + (b + 1) * 256 : nullptr;
        for (int64_t p = 0; p < panels; ++p) {
          if (next)  // this product's share of the tiles, all 16 lines of each
            for (int64_t s = p * (kv / 16) / panels; s < (p + 1) * (kv / 16) / panels; ++s)
              prefetch_share(next + s * strip, 16, 16, 0, 1);
          const __mmask16 cols = first_n(hd - p * 16);
          tile_panels(dh + b * 16 * hd + p * 16, hd, rows, cols, v0 > 0, at, ep + p * v16 * 16 + v0 * 16, kv);
        }
      }
    }
  }
}

#else  // no AVX-512: loss.cc keeps its row-major path

bool tied_head_fused_built() { return false; }

void tied_head_forward(float*, float*, float*, float*, const float*, const float*, const int32_t*, int64_t,
                       int64_t, int64_t, float) {
  ZAYA_CHECK(false, "tied_head_forward: this build has no AVX-512");
}

void tied_head_backward_gemms(float*, float*, const float*, const float*, const float*, const float*, int64_t,
                              int64_t, int64_t, float) {
  ZAYA_CHECK(false, "tied_head_backward_gemms: this build has no AVX-512");
}

#endif

}  // namespace zaya::ops::cpu
