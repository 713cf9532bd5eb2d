// A small register-blocked matrix product for the sequence-op kernels (attention tiles, the CCA
// grouped conv): C[m, n] (+)= Σ_k A(i, k)·B[k, 0..n) with A(i, k) = a[i·a_rs + k·a_cs] (so Aᵀ is a
// stride swap) and B rows contiguous (ld ldb). Called from inside the ops' own OpenMP loops, where a
// oneDNN call would nest its threads, on products too small for a primitive to pay off.
// Register blocking: 4 rows × up to 64 columns of C stay in up to 16 AVX-512 registers while k
// runs, so each B row is loaded once per 4 rows of A. With AVX2 only: 6 rows × 16 columns in 12 of
// its 16 registers (a 64³ product on one Zen 3 core: 93 GFLOP/s, against 73 for the 4 × 24 blocks
// it replaced, whose 64-column panels ended in a masked 16-column block). Each C element is one FMA
// chain over k in order: the result depends only on the inputs (never on threads or on how the
// caller splits m or on the row blocking).
// mm_block and mm_rows are always inlined: the register block needs its caller's constant strides
// and column counts, and GCC's own budget once called mm_block<4, 4> out of line from the attention
// backward after 12 unrelated lines were added there (0.78–0.84× on that kernel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "zaya/ops/cpu/seq_vec.h"

namespace zaya::ops::cpu {

// Which part of a square diagonal tile of causal attention a product needs (row i of A or C is
// query/key i of the tile, and query i sees keys j ≤ i):
//   cols_le_row  C(i, j) is used only for j ≤ i (scores): the columns past it are not computed and
//                keep whatever they held;
//   k_le_row     A(i, kk) = 0 for kk > i (probabilities × values, dS × keys): those terms are skipped;
//   k_ge_row     A(i, kk) = 0 for kk < i (Pᵀ and dSᵀ, rows being keys): those terms are skipped.
// A skipped term is an exact zero product, so every computed element is bitwise what the full
// product gives; on a diagonal tile about 40% of the work is skipped.
enum class Causal { none, cols_le_row, k_le_row, k_ge_row };

// The most rows mm puts in one register block. k_le_row runs a block of rows [i, i + R) over
// kk < i + R, so a caller's A must hold zeros (not just be unused) at A(i, kk) for kk up to
// i + kMaxRowBlock − 1.
#if ZAYA_AVX2 && !defined(__AVX512F__)
constexpr int kMaxRowBlock = 6;
#else
constexpr int kMaxRowBlock = 4;
#endif

namespace tile_detail {

#if defined(__AVX512F__)
// C rows [0, R) × columns [c0, c0 + 16·NV) ∩ [0, n), over k in [k0, k1).
template <int R, int NV>
[[gnu::always_inline]] inline void mm_block(float* C, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                                            const float* B, int64_t ldb, int64_t c0, int64_t n, int64_t k0,
                                            int64_t k1, bool accumulate) {
  __mmask16 mk[NV];
  for (int v = 0; v < NV; ++v) mk[v] = first_lanes(n - c0 - 16 * v);
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(mk[v], C + r * ldc + c0 + 16 * v) : _mm512_setzero_ps();
  for (int64_t kk = k0; kk < k1; ++kk) {
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_maskz_loadu_ps(mk[v], B + kk * ldb + c0 + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * a_rs + kk * a_cs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(C + r * ldc + c0 + 16 * v, mk[v], acc[r][v]);
}
#elif ZAYA_AVX2

// mm_block on 8-lane vectors: C rows [0, R) × columns [c0, c0 + 8·NV) ∩ [0, n), over k in [k0, k1).
// The same FMA chain per element as the AVX-512 form, so the same bits. Full: all 8·NV columns are
// in range, so plain loads and stores (masked ones cost more on AMD cores).
template <int R, int NV, bool Full>
[[gnu::always_inline]] inline void mm_block(float* C, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                                            const float* B, int64_t ldb, int64_t c0, int64_t n, int64_t k0,
                                            int64_t k1, bool accumulate) {
  __m256i mk[NV];
  for (int v = 0; v < NV; ++v) mk[v] = first_lanes8(n - c0 - 8 * v);
  auto load = [&](const float* p, int v) { return Full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mk[v]); };
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? load(C + r * ldc + c0 + 8 * v, v) : _mm256_setzero_ps();
  for (int64_t kk = k0; kk < k1; ++kk) {
    __m256 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(B + kk * ldb + c0 + 8 * v, v);
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * a_rs + kk * a_cs);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + c0 + 8 * v;
      if (Full)
        _mm256_storeu_ps(c, acc[r][v]);
      else
        _mm256_maskstore_ps(c, mk[v], acc[r][v]);
    }
}
#endif

template <int R>
[[gnu::always_inline]] inline void mm_rows(float* C, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                                           const float* B, int64_t ldb, int64_t n, int64_t k0, int64_t k1,
                                           bool accumulate) {
#if defined(__AVX512F__)
  for (int64_t c0 = 0; c0 < n; c0 += 64) {
    switch (std::min<int64_t>(4, (n - c0 + 15) / 16)) {  // only the 16-column vectors that hold columns
      case 1: mm_block<R, 1>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate); break;
      case 2: mm_block<R, 2>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate); break;
      case 3: mm_block<R, 3>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate); break;
      default: mm_block<R, 4>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate); break;
    }
  }
#elif ZAYA_AVX2
  int64_t c0 = 0;
  for (; c0 + 16 <= n; c0 += 16) mm_block<R, 2, true>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate);
  switch ((n - c0 + 7) / 8) {  // the last 1-15 columns
    case 0: break;
    case 1: mm_block<R, 1, false>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate); break;
    default: mm_block<R, 2, false>(C, ldc, a, a_rs, a_cs, B, ldb, c0, n, k0, k1, accumulate); break;
  }
#else
  for (int r = 0; r < R; ++r) {
    float* c = C + r * ldc;
    if (!accumulate) std::fill_n(c, n, 0.0f);
    for (int64_t kk = k0; kk < k1; ++kk) axpyf(c, a[r * a_rs + kk * a_cs], B + kk * ldb, n);
  }
#endif
}

}  // namespace tile_detail

inline void mm(float* C, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
               int64_t m, int64_t n, int64_t k, bool accumulate, Causal causal = Causal::none) {
  // Rows [i, i + R) of C as one register block, with the columns and the k range that block needs.
  // Column panels of 64 outermost: a panel of B (k × 64 floats) stays in L1 while every row block
  // of A passes over it. With row blocks outermost all of B is read again every 4 rows, from L2
  // once B outgrows L1 (the CCA backward's 64 × 128 weight block): a loop of that product alone
  // ran 2× faster this way; inside the CCA backward, where the same FMA rate is reached between
  // the element-wise passes, the gain measured 1.0–1.1× (tools/bench_ab.py, 6 rounds).
  constexpr int64_t kPanel = 64;
  for (int64_t p0 = 0; p0 < n; p0 += kPanel) {
    const int64_t p1 = std::min(n, p0 + kPanel);
    auto block = [&](auto rows, int64_t i) {
      constexpr int R = decltype(rows)::value;
      int64_t ni = p1, k0 = 0, k1 = k;
      if (causal == Causal::cols_le_row) ni = std::min(p1, i + R);
      if (causal == Causal::k_le_row) k1 = std::min(k, i + R);
      if (causal == Causal::k_ge_row) k0 = std::min(k, i);
      if (ni > p0)
        tile_detail::mm_rows<R>(C + i * ldc + p0, ldc, a + i * a_rs, a_rs, a_cs, B + p0, ldb, ni - p0, k0, k1,
                                accumulate);
    };
    int64_t i = 0;
    if constexpr (kMaxRowBlock == 6)
      for (; i + 6 <= m; i += 6) block(std::integral_constant<int, 6>{}, i);
    for (; i + 4 <= m; i += 4) block(std::integral_constant<int, 4>{}, i);
    for (; i < m; ++i) block(std::integral_constant<int, 1>{}, i);
  }
}

}  // namespace zaya::ops::cpu
