// The tied LM head and its softmax as one kernel family, for AVX-512 (zaya/ops/loss.h's kept-exps
// case: one vocabulary chunk covers V, as for the demo's 8192). Arguments are checked by the caller.
//
// Why not three library GEMMs around a softmax pass: the [N, V] matrix of logits / exponentials e
// is the A operand of all three products and far larger than the caches (64 MiB for the demo).
// A library GEMM re-packs it on every call (a transpose for dh = e·E, a gather of 16-float pieces
// 32 KiB apart for dE = eᵀ·(r ⊙ h)), and the softmax reads and writes it once more from memory.
// Here e lives in a *strip layout* that every product reads as it is:
//
//   strip s holds columns 16s..16s+15 of every row, row after row: element (t, v) is at
//   e[(v / 16) · n16 · 16 + t · 16 + v % 16], n16 = N rounded up to 16 (padded rows and columns 0).
//
//   * The forward runs in vocabulary blocks of 32 rows (2 strips), each block's Eᵀ held in L1 while
//     every token passes, and writes e relative to the block's own row max m_b (no second pass
//     over e once the row max over all V is known). After e's strips the workspace holds, per
//     block and token, m_b, which the forward's end turns into the block's scale
//     c_b = exp(m_b − max_v logit), and the block's Σe. So exp(logit − max) is e·c_b, and the
//     backward applies c_b where it reads e (a scaled copy of each strip piece, a scaled transpose).
//   * dE += eᵀ·(r ⊙ h): strip s, tokens t0.., is already the k-major 16-wide panel a GEMM kernel
//     wants for op(A) = eᵀ (16 vocabulary rows per token).
//   * dh = e·E: each token block's tiles, transposed, are the k-major panel of op(A) = e.
//
// Every C element is one FMA chain in a fixed k order, summed by one thread whatever the thread
// count, so the results do not depend on it; the row sums add the blocks' Σe·c_b in block order.
#pragma once

#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace zaya::ops::cpu {

// Whether this build has the fused head (compiled for AVX-512).
bool tied_head_fused_built();

// f32 elements of the fused head's workspace for n tokens and a vocabulary of `vocab`: the
// strip-layout e, then the blocks' scales and sums.
int64_t tied_head_strip_elems(int64_t n, int64_t vocab);

// logits = h·Eᵀ (h [n, hd], E [vocab, hd], row-major) into `e` (strip layout), then for every row t:
// row_max[t] = max_v logit, picked[t] = logit of targets[t] where 0 ≤ targets[t] < vocab (left
// alone otherwise), e = exp(logit − m_b) with values below `tiny` stored as 0 (m_b: the row's max
// over its 32-row vocabulary block), the block scales c_b after e, row_sum[t] = Σ_b c_b·Σ_{v in b} e.
void tied_head_forward(float* e, float* row_max, float* row_sum, float* picked, const float* h,
                       const float* E, const int32_t* targets, int64_t n, int64_t hd, int64_t vocab,
                       float tiny);

// From tied_head_forward's e and block scales c (p = e·c, the softmax numerators over the row max,
// stored as 0 below `tiny` as the forward's e): dE += pᵀ·(r ⊙ h) ([vocab, hd], accumulated) and
// dh = p·E ([n, hd], written); r [n] scales row t of h.
void tied_head_backward_gemms(float* dE, float* dh, const float* e, const float* h, const float* r,
                              const float* E, int64_t n, int64_t hd, int64_t vocab, float tiny);

#if defined(__AVX512F__)
// The backward's tile product, for probes that time it on other operands
// (tools/tn_wgrad_probe.cc): C[i·ldc + j] (+)= Σ_k a[k·16 + i]·b[k·16 + j] over k < kc, for rows
// i < rows and the columns in `cols`, a and b k-major panels 16 wide (64-byte aligned), each
// element one FMA chain in k order, from C's value when accumulate, else from zero.
void tile_panels(float* C, int64_t ldc, int64_t rows, __mmask16 cols, bool accumulate, const float* a,
                 const float* b, int64_t kc);
#endif

}  // namespace zaya::ops::cpu
