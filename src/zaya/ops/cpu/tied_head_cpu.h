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
//   * The forward writes each 16 × 16 tile of logits (16 tokens × 16 vocabulary rows) as one
//     contiguous KiB, and takes the softmax of 16 tokens while their 512 KiB of tiles are still
//     in cache (the row max on the tile just written, then exp in place).
//   * dE += eᵀ·(r ⊙ h): strip s, tokens t0.., is already the k-major 16-wide panel a GEMM kernel
//     wants for op(A) = eᵀ (16 vocabulary rows per token).
//   * dh = e·E: the kernel broadcasts e[t][v] for 16 tokens and one v at a time straight from the
//     tiles (row i of a tile, lane kk).
//
// Every C element is one FMA chain in a fixed k order, summed by one thread whatever the thread
// count, so the results do not depend on it. The row sums use exp_store_sum's lane order and tree
// (seq_vec.h): the same partial sums as the row-major path for the same exponentials.
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

// Whether this build has the fused head (compiled for AVX-512).
bool tied_head_fused_built();

// f32 elements of the strip-layout e for n tokens and a vocabulary of `vocab`.
int64_t tied_head_strip_elems(int64_t n, int64_t vocab);

// logits = h·Eᵀ (h [n, hd], E [vocab, hd], row-major) into `e` (strip layout), then for every row t:
// row_max[t] = max_v logit, picked[t] = logit of targets[t] where 0 ≤ targets[t] < vocab (left
// alone otherwise), e = exp(logit − max) with values below `tiny` stored as 0, row_sum[t] = Σ_v e.
void tied_head_forward(float* e, float* row_max, float* row_sum, float* picked, const float* h,
                       const float* E, const int32_t* targets, int64_t n, int64_t hd, int64_t vocab,
                       float tiny);

// From tied_head_forward's e: dE += eᵀ·(r ⊙ h) ([vocab, hd], accumulated) and dh = e·E ([n, hd],
// written); r [n] scales row t of h.
void tied_head_backward_gemms(float* dE, float* dh, const float* e, const float* h, const float* r,
                              const float* E, int64_t n, int64_t hd, int64_t vocab);

}  // namespace zaya::ops::cpu
