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
}  // namespace

int64_t tied_head_strip_elems(int64_t n, int64_t vocab) { return strip_stride(n) * ((vocab + 15) / 16); }

#if defined(__AVX512F__)

bool tied_head_fused_built() { return true; }

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

// A 16 × 16 tile of C, out[i·16 + j] = Σ_k a[k·16 + i] · b[k·16 + j] over k < kc: both operands
// k-major panels 16 wide. One FMA chain per element in k order (16 accumulators, one B vector and
// one broadcast per step: the FMA unit's rate with the panels in L1/L2). With kPrefetch, one
// 64-byte line of `next` per two k steps is asked into L2 (kc/2 lines from next on): the caller's
// next B panel, which would otherwise come from L3 when the tile loop reaches it.
template <bool kPrefetch = false>
__attribute__((noinline)) void tile_panels(float* out, const float* a, const float* b, int64_t kc,
                                           const float* next = nullptr) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    if (kPrefetch && k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + k * 8), _MM_HINT_T1);
    const __m512 bv = _mm512_load_ps(b + k * 16);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * 16 + i]), bv, acc[i]);
  }
  for (int i = 0; i < 16; ++i) _mm512_store_ps(out + i * 16, acc[i]);
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
// core (tools/tile_loop_probe.cc de 2048 / de 256, 4 alternations; session 13's Zen 4 sweep had
// short blocks slower, but in one pass over all of dE per block, not this layout, which is
// unmeasured there). Vocabulary rows per k block of dh's: the B block of all 16-column
// panels (hd · 256 floats, 256 KiB for hd = 256) stays in L2 while the token blocks pass over it,
// and a token block's transposed tiles (16 KiB) stay in L1 beside each 16 KiB B panel piece; with
// 512 rows (32 KiB, the L1 shared with 32 KiB pieces) the backward took 68–71 against 63–64 ms
// (tools/tied_head_probe.cc, best of 8, five alternations; the demo step 1.02×).
constexpr int64_t kTokenBlock = 256;
constexpr int64_t kStripGroup = 16;
constexpr int64_t kVocabBlock = 256;

// Token blocks of 16 whose logits the forward makes together: each 16 KiB panel of Eᵀ is read
// from L3 once per group instead of once per block.
constexpr int64_t kGroup = 2;
static_assert(kGroup == 2, "each tile of a group prefetches half of the next strip's panel (tied_head_forward)");

// The softmax of one token block (16 rows, `rows` of them real, the first at token t0) whose logits
// are in `logits` (tile s at logits + s·ls) and whose per-lane maxima are mx: picks the targets'
// logits, then e = exp(logit − row max) with values below tiny stored as 0 into e's tiles (tile s at
// e + s·es), summed per lane in strip order (lane l of a row adds columns l, 16 + l, ... as
// exp_store_sum's acc[l] does) and reduced with sum16's tree. e is written with streaming stores
// when 64-byte aligned: nothing reads it before the backward, and it is far larger than the caches.
void block_softmax(float* e, int64_t es, const float* logits, int64_t ls, int64_t strips, const __m512* mx,
                   int64_t rows, int64_t t0, const int32_t* targets, int64_t vocab, float tiny,
                   float* row_max, float* row_sum, float* picked) {
  float m[16];
  for (int i = 0; i < 16; ++i) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, mx[i]);
    m[i] = *std::max_element(lanes, lanes + 16);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t tg = targets[t0 + i];
    if (tg >= 0 && tg < vocab) picked[t0 + i] = logits[(tg / 16) * ls + i * 16 + tg % 16];
  }
  const bool stream = reinterpret_cast<uintptr_t>(e) % 64 == 0 && es % 16 == 0;
  const __m512 tiny_v = _mm512_set1_ps(tiny);
  __m512 sum[16];
  for (int i = 0; i < 16; ++i) sum[i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < strips; ++s) {
    const float* src = logits + s * ls;
    float* dst = e + s * es;
    for (int i = 0; i < 16; ++i) {
      __m512 v = expf_fast_v(_mm512_sub_ps(_mm512_load_ps(src + i * 16), _mm512_set1_ps(m[i])));
      v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, tiny_v, _CMP_NLT_UQ), v);  // below tiny → 0, NaN kept
      if (i >= rows) v = _mm512_setzero_ps();  // padded rows: 0, for the products that read them
      if (stream)
        _mm512_stream_ps(dst + i * 16, v);
      else
        _mm512_storeu_ps(dst + i * 16, v);
      sum[i] = _mm512_add_ps(sum[i], v);
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum[i]);
    row_sum[t0 + i] = sum16(lanes);
    row_max[t0 + i] = m[i];
  }
}

}  // namespace

void tied_head_forward(float* e, float* row_max, float* row_sum, float* picked, const float* h,
                       const float* E, const int32_t* targets, int64_t n, int64_t hd, int64_t vocab,
                       float tiny) {
  const int64_t n16 = round16(n), strips = round16(vocab) / 16, tail = vocab - (strips - 1) * 16;
  const int64_t strip = strip_stride(n);  // floats from one strip to the next
  // Eᵀ as k-major panels, one per strip: bt[s·hd·16 + k·16 + j] = E[16s + j][k].
  // Per thread after Eᵀ: the group's A panels and its logits (tile (s, b) at (s·kGroup + b)·256).
  const int64_t per_thread = kGroup * 16 * hd + strips * kGroup * 256;
  float* bt = scratch(strips * hd * 16 + per_thread * omp_get_max_threads());
  const int64_t blocks = n16 / 16, groups = (blocks + kGroup - 1) / kGroup;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 16)
    for (int64_t s = 0; s < strips; ++s)
      pack_rows_transposed(bt + s * hd * 16, E + s * 16 * hd, hd, std::min<int64_t>(16, vocab - s * 16), hd);
    float* ap = bt + strips * hd * 16 + per_thread * omp_get_thread_num();
    float* logits = ap + kGroup * 16 * hd;
    // Dynamic schedules here and below: every iteration writes only its own outputs, so the bits do
    // not depend on who runs it, and the two threads of a shared VM often run at different speeds
    // (a static split left one idle ~9% of the forward; docs/CONTRIBUTING.md, "Adding an op").
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t b0 = g * kGroup, nb = std::min(kGroup, blocks - b0);
      for (int64_t b = 0; b < nb; ++b)
        pack_rows_transposed(ap + b * 16 * hd, h + (b0 + b) * 16 * hd, hd,
                             std::min<int64_t>(16, n - (b0 + b) * 16), hd);
      // Logits tile by tile, each B panel used for the group's blocks in turn (from L1 after the
      // first), with a running max per row and lane (max is exact: any order).
      __m512 mx[kGroup * 16];
      for (int i = 0; i < kGroup * 16; ++i) mx[i] = _mm512_set1_ps(-INFINITY);
      for (int64_t s = 0; s < strips; ++s) {
        const bool partial = s == strips - 1 && tail < 16;
        for (int64_t b = 0; b < nb; ++b) {
          float* tile = logits + (s * kGroup + b) * 256;
          // Eᵀ's panels (8 MiB for the demo) stream from L3 once per group; each of the group's
          // tiles asks for its share of the next strip's panel meanwhile (one Intel Xeon core,
          // tools/tile_loop_probe.cc forward 512 2 [prefetch]: 123–137 against 113–127 GFLOP/s
          // without, 133–142 with Eᵀ in L2).
          if (s + 1 < strips)
            tile_panels<true>(tile, ap + b * 16 * hd, bt + s * hd * 16, hd, bt + (s + 1) * hd * 16 + b * hd * 8);
          else
            tile_panels(tile, ap + b * 16 * hd, bt + s * hd * 16, hd);
          for (int i = 0; i < 16; ++i) {
            __m512 v = _mm512_load_ps(tile + i * 16);
            if (partial) {  // columns past V hold −inf: no part in the max, and exp makes them 0
              v = _mm512_mask_blend_ps(first_n(tail), _mm512_set1_ps(-INFINITY), v);
              _mm512_store_ps(tile + i * 16, v);
            }
            mx[b * 16 + i] =
                _mm512_mask_max_ps(v, 0xFFFF, v, mx[b * 16 + i]);  // masked: GCC 12 warns on the plain one
          }
        }
      }
      for (int64_t b = 0; b < nb; ++b)
        block_softmax(e + (b0 + b) * 256, strip, logits + b * 256, kGroup * 256, strips, mx + b * 16,
                      std::min<int64_t>(16, n - (b0 + b) * 16), (b0 + b) * 16, targets, vocab, tiny, row_max,
                      row_sum, picked);
    }
    _mm_sfence();  // each thread's streaming stores are visible before anyone reads e
  }
}

void tied_head_backward_gemms(float* dE, float* dh, const float* e, const float* h, const float* r,
                              const float* E, int64_t n, int64_t hd, int64_t vocab) {
  const int64_t n16 = round16(n), v16 = round16(vocab), strips = v16 / 16, panels = round16(hd) / 16;
  const int64_t strip = strip_stride(n), rstride = n16 * 16;
  // k-major panels of the two right operands, 16 columns of hd each (0 past hd, n or V):
  // rh[p·n16·16 + t·16 + j] = r[t]·h[t][16p + j], ep[p·v16·16 + v·16 + j] = E[v][16p + j].
  float* rh = scratch(panels * (n16 + v16) * 16 + kVocabBlock * 16 * omp_get_max_threads());
  float* ep = rh + panels * rstride;
#pragma omp parallel
  {
    pack_column_panels(rh, rstride, h, hd, n, n16, hd, r);
    pack_column_panels(ep, v16 * 16, E, hd, vocab, v16, hd, nullptr);
    alignas(64) float tile[256];
    float* at = ep + panels * v16 * 16 + kVocabBlock * 16 * omp_get_thread_num();  // dh's A panel
    // dE += eᵀ·rh: tile (strip s, panel p) sums tokens in blocks of kTokenBlock, each block's
    // partial added to dE in block order (one task owns a strip's rows: the same bits on any
    // thread count).
#pragma omp for schedule(dynamic, 1)
    for (int64_t s0 = 0; s0 < strips; s0 += kStripGroup)
      for (int64_t t0 = 0; t0 < n16; t0 += kTokenBlock) {
        const int64_t kt = std::min(kTokenBlock, n16 - t0);
        for (int64_t s = s0; s < std::min(strips, s0 + kStripGroup); ++s) {
          const int64_t rows = std::min<int64_t>(16, vocab - s * 16);
          for (int64_t p = 0; p < panels; ++p) {
            tile_panels(tile, e + s * strip + t0 * 16, rh + p * rstride + t0 * 16, kt);
            const __mmask16 cols = first_n(hd - p * 16);
            for (int64_t i = 0; i < rows; ++i) {
              float* c = dE + (s * 16 + i) * hd + p * 16;
              _mm512_mask_storeu_ps(
                  c, cols, _mm512_add_ps(_mm512_maskz_loadu_ps(cols, c), _mm512_load_ps(tile + i * 16)));
            }
          }
        }
      }
    // dh = e·E: tile (token block b, panel p) sums vocabulary rows in blocks of kVocabBlock.
    for (int64_t v0 = 0; v0 < v16; v0 += kVocabBlock) {
      const int64_t kv = std::min(kVocabBlock, v16 - v0);
#pragma omp for schedule(dynamic, 2)
      for (int64_t b = 0; b < n16 / 16; ++b) {
        const int64_t rows = std::min<int64_t>(16, n - b * 16);
        // This block's tiles as one k-major panel: broadcasting straight from the tiles (16 loads
        // from 16 lines at the same offset per k) ran at ~190 instead of ~200 GFLOP/s.
        for (int64_t s = 0; s < kv / 16; ++s)
          transpose16(at + s * 256, 16, e + (v0 / 16 + s) * strip + b * 256, 16);
        for (int64_t p = 0; p < panels; ++p) {
          tile_panels(tile, at, ep + p * v16 * 16 + v0 * 16, kv);
          const __mmask16 cols = first_n(hd - p * 16);
          for (int64_t i = 0; i < rows; ++i) {
            float* c = dh + (b * 16 + i) * hd + p * 16;
            const __m512 old = v0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(cols, c);
            _mm512_mask_storeu_ps(c, cols, _mm512_add_ps(old, _mm512_load_ps(tile + i * 16)));
          }
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
                              int64_t, int64_t) {
  ZAYA_CHECK(false, "tied_head_backward_gemms: this build has no AVX-512");
}

#endif

}  // namespace zaya::ops::cpu
