// ZAYA1 MoE routing and the token permutation around the expert GEMMs (DESIGN.md, "Router" and
// "Experts"), forward and backward.
//
// Routing: p = softmax(logits) over E+1 classes (class E = skip) in fp32; the choice is
// argmax_e (p_e + β_e) on the probabilities (lowest index on a tie), β not trained; the weight is the
// unbiased p_choice, or 0 when the skip class wins (that token goes to no expert and sends no
// gradient anywhere). Permutation: routed tokens are gathered into expert-contiguous order, stable
// (token order kept within an expert), and scattered back weighted: out[n] = w[n]·y[pos[n]], rows of
// skipped tokens 0. Index tensors are i32.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// logits [N, E+1], beta [E+1] → probs [N, E+1] (kept for backward), choice [N] (in [0, E]; E = skip),
// weight [N].
void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits, const Tensor& beta, int64_t N,
               int64_t E);
// Through p_choice and the softmax: dlogits[n, e] = dweight[n]·p_c·(δ_ec − p_e) for the chosen c < E;
// rows of skipped tokens are 0. dlogits written.
void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice, int64_t N,
                        int64_t E);

// From the choices: counts [E] tokens per expert (the load statistics), offsets [E+1] (exclusive
// prefix sum), pos [N] each token's row in the permuted order (−1 if skipped) and src [N] whose
// first M entries are the token of each permuted row. Returns M = Σ counts.
int64_t moe_plan(const Tensor& counts, const Tensor& offsets, const Tensor& pos, const Tensor& src, const Tensor& choice, int64_t N,
                 int64_t E);

// xp[r] = x[src[r]] for r < M. x [N, H]; xp has at least M rows of H.
void moe_gather(const Tensor& xp, const Tensor& x, const Tensor& src, int64_t M, int64_t N, int64_t H);
// The same for rows r0 <= r < r1 only: one expert's rows, inside a caller's own parallel loop over
// experts (the model's fused experts), where it runs on the calling thread.
void moe_gather_rows(const Tensor& xp, const Tensor& x, const Tensor& src, int64_t r0, int64_t r1, int64_t N,
                     int64_t H);
// dx[n] = dxp[pos[n]], 0 for skipped tokens (top-1: each token appears at most once). dx written.
void moe_gather_backward(const Tensor& dx, const Tensor& dxp, const Tensor& pos, int64_t M, int64_t N, int64_t H);

// out[n] = weight[n]·y[pos[n]], 0 for skipped tokens. y has at least M rows.
void moe_unpermute(const Tensor& out, const Tensor& y, const Tensor& weight, const Tensor& pos, int64_t M, int64_t N,
                   int64_t H);
// dy[pos[n]] = weight[n]·dout[n]; dweight[n] = ⟨dout[n], y[pos[n]]⟩ (0 for skipped). Both written.
// y f32, or bf16 (the saved copy of bf16 activations): widened exactly as it is read, so the result
// is bitwise the f32 op's on the widened y.
void moe_unpermute_backward(const Tensor& dy, const Tensor& dweight, const Tensor& dout, const Tensor& y, const Tensor& weight,
                            const Tensor& pos, int64_t M, int64_t N, int64_t H);

}  // namespace zaya::ops
