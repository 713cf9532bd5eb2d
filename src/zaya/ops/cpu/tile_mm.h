// A small register-blocked matrix product for the sequence-op kernels (attention tiles, the CCA
// grouped conv): C[m, n] (+)= Σ_k A(i, k)·B[k, 0..n) with A(i, k) = a[i·a_rs + k·a_cs] (so Aᵀ is a
// stride swap) and B rows contiguous (ld ldb). Called from inside the ops' own OpenMP loops, where a
// oneDNN call would nest its threads, on products too small for a primitive to pay off.
// Register blocking: 4 rows × 64 columns of C stay in 16 AVX-512 registers while k runs, so each B
// row is loaded once per 4 rows of A. Each C element is one FMA chain over k in order: the result
// depends only on the inputs (never on threads or on how the caller splits m).
#pragma once

#include <algorithm>
#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "zaya/ops/cpu/seq_vec.h"

namespace zaya::ops::cpu {

template <int R>
inline void mm_rows(float* C, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* B,
                    int64_t ldb, int64_t n, int64_t k, bool accumulate) {
#if defined(__AVX512F__)
  for (int64_t c0 = 0; c0 < n; c0 += 64) {
    __mmask16 mk[4];
    for (int v = 0; v < 4; ++v) {
      const int64_t left = std::clamp<int64_t>(n - c0 - 16 * v, 0, 16);
      mk[v] = static_cast<__mmask16>((1u << left) - 1u);
    }
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v)
        acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(mk[v], C + r * ldc + c0 + 16 * v) : _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; ++kk) {
      __m512 b[4];
      for (int v = 0; v < 4; ++v) b[v] = _mm512_maskz_loadu_ps(mk[v], B + kk * ldb + c0 + 16 * v);
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(a[r * a_rs + kk * a_cs]);
        for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(C + r * ldc + c0 + 16 * v, mk[v], acc[r][v]);
  }
#else
  for (int r = 0; r < R; ++r) {
    float* c = C + r * ldc;
    if (!accumulate) std::fill_n(c, n, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) axpyf(c, a[r * a_rs + kk * a_cs], B + kk * ldb, n);
  }
#endif
}

inline void mm(float* C, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
               int64_t m, int64_t n, int64_t k, bool accumulate) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) mm_rows<4>(C + i * ldc, ldc, a + i * a_rs, a_rs, a_cs, B, ldb, n, k, accumulate);
  for (; i < m; ++i) mm_rows<1>(C + i * ldc, ldc, a + i * a_rs, a_rs, a_cs, B, ldb, n, k, accumulate);
}

}  // namespace zaya::ops::cpu
