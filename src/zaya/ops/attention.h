// Causal grouped-query softmax attention (DESIGN.md, CCA step 7): q head h reads kv head ⌊h/G⌋,
// G = nq/nkv, scale 1/√hd, position i attends to keys j ≤ i.
//
// Forward is tiled flash-attention style (blocks of 64 queries × 64 keys with a running max and
// sum): it keeps only the output and the per-row logsumexp lse [B, nq, T] — O(T) memory, never a
// T×T matrix. Backward recomputes the probabilities tile by tile from lse (P = exp(S − lse),
// D_i = ⟨dO_i, O_i⟩, dS = P ⊙ (dO·Vᵀ − D)) once per tile, in one task per (batch row, kv head)
// that owns dk, dv of its key blocks and dq of its G q heads (key blocks in order, then the heads'
// query blocks) — so every output element has one writer and a fixed summation order: bitwise
// deterministic for any thread count. On CUDA (cuda/attention.cu): cuDNN's fused SDPA in bf16 where
// it is available, else fp32 reference kernels (docs/cuda.md, "Attention").
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// q, out [B, T, nq, hd]; k, v [B, T, nkv, hd] (or [B, T, heads·hd]); lse [B, nq, T] written.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                       int64_t T, int64_t nq, int64_t nkv, int64_t hd);
// dq, dk, dv written (activation gradients). Needs the forward's out and lse.
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t nq,
                        int64_t nkv, int64_t hd);
// Causal attention of Tq queries at global positions q_pos .. q_pos+Tq−1 against the keys and
// values of positions 0 .. Tk−1 (Tk ≥ q_pos + Tq): query i sees keys j ≤ q_pos + i. What a
// context-parallel rank computes for one of its sequence chunks against the gathered K/V
// (docs/context-parallel.md). q, out [B, Tq, nq, hd]; k, v [B, Tk, nkv, hd]; lse [B, nq, Tq].
// On the CPU a q_pos that is a multiple of 64 (a chunk aligned to the tiles) runs attention_forward's
// tiled kernel with the offset (bitwise attention_forward at q_pos = 0, Tq = Tk); any other q_pos a
// row-by-row kernel (cpu/attention_at_cpu.cc), equal to rounding. On CUDA: the fp32 reference
// kernels with the key offset q_pos (cuda/attention.cu), never cuDNN's bf16 SDPA.
void attention_at_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                          int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd);
// dq written (added to with accumulate_dq); dk, dv [B, Tk, nkv, hd] ACCUMULATED (+=): the chunks
// of one rank add their parts of the gathered keys' gradients into one buffer. Needs the forward's
// out and lse.
void attention_at_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                           const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                           int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd,
                           bool accumulate_dq = false);
// The two halves of a context-parallel chunk's attention when it is split to overlap the K/V
// exchange (docs/context-parallel.md, "Overlap"): the chunk against its own keys is
// attention_at_forward at q_pos = 0; the chunk against the Tk keys before it, all of which every
// query sees, is attention_prefix_forward; attention_merge combines the two with their lse.
// q, out [B, Tq, nq, hd]; k, v [B, Tk, nkv, hd]; lse [B, nq, Tq] written. On the CPU the tiled kernel
// when Tk is a multiple of 64, else the row-by-row one; on CUDA the fp32 reference kernels.
void attention_prefix_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv, int64_t hd);
// dq, dk and dv all ACCUMULATED (+=): dq adds to the chunk's own keys' part. out and lse are the
// merged forward's (the softmax is over both halves: P = exp(s − lse) with the merged lse).
void attention_prefix_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv,
                               int64_t hd);
// (out_a, lse_a) ← the merge of two partial attentions of the same queries over disjoint key sets:
// lse = log(e^lse_a + e^lse_b), out = (e^lse_a·out_a + e^lse_b·out_b) / e^lse (math::softmax_merge).
// out_* [B, T, nq, hd], lse_* [B, nq, T] as attention_forward writes them.
void attention_merge(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                     int64_t T, int64_t nq, int64_t hd);
// One query token per batch row against a KV cache: q, out [B, nq, hd] (or [B, 1, nq, hd]); caches
// [B, S_cap, nkv, hd] of which the first S positions are valid (the new token's K/V included).
void attention_decode(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t B,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd);

}  // namespace zaya::ops
