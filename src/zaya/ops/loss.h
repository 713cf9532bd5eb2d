// Fused cross-entropy with the tied LM head: the logits h·Eᵀ are made one vocabulary chunk at a
// time, so the [N, V] matrix (2048 × 262144 f32 = 2 GiB for ZAYA1) is never held.
//
// loss = mean over rows with targets[n] != ignore_index of logsumexp(h[n]·Eᵀ) − h[n]·E[targets[n]].
// The forward keeps a running (max, sum) per row across chunks (online logsumexp). The backward
// recomputes each chunk's logits, turns them into (softmax − onehot)/count in place and feeds two
// GEMMs: dh (written) and dE (accumulated, the tied embedding's gradient from the head).
// When one chunk covers the vocabulary (V ≤ chunk: the demo's 8192) nothing is recomputed: the
// forward leaves exp(logit − row max) and the row sums in the workspace, and the backward runs its
// two GEMMs on them directly, with the 1/(count·Σ) row scale and the one-hot term applied as [N, H]
// corrections (cpu/loss_cpu.cc, backward_kept): no second pass over the [N, V] matrix.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

struct CrossEntropyOptions {
  int64_t chunk = 8192;          // vocabulary columns per chunk
  int32_t ignore_index = -100;   // targets equal to this contribute nothing
};

struct CrossEntropyResult {
  double loss = 0;    // mean over counted rows; 0 when every target is ignored
  int64_t count = 0;  // rows that were not ignored
};

// On the CPU, where the build has AVX-512, that single-chunk case runs on the fused head
// (cpu/tied_head_cpu.h): the three products and the softmax on e kept in a 16-column strip layout
// that each product reads without re-packing it (docs/ops-cpu.md, "The fused tied head").

// f32 elements the workspace needs: one [N, min(chunk, V)] logits chunk (for the CPU's fused head, N
// and V rounded up to 16) plus two [N] row buffers.
int64_t cross_entropy_workspace_elems(int64_t n, int64_t vocab, const CrossEntropyOptions& opt = {});

// h [N, H] f32 (already final-normed), E [V, H] f32, targets i32 [N]; lse [N] receives each row's
// logsumexp; workspace is an f32 tensor with at least cross_entropy_workspace_elems elements (its
// contents on return are the op's own, see above).
CrossEntropyResult cross_entropy_tied_forward(const Tensor& lse, const Tensor& h, const Tensor& E,
                                              const Tensor& targets, const Tensor& workspace,
                                              const CrossEntropyOptions& opt = {});

// Forward, then backward of the mean loss: dh [N, H] written, dE [V, H] accumulated (+=).
CrossEntropyResult cross_entropy_tied_forward_backward(const Tensor& dh, const Tensor& dE, const Tensor& lse,
                                                       const Tensor& h, const Tensor& E, const Tensor& targets,
                                                       const Tensor& workspace,
                                                       const CrossEntropyOptions& opt = {});

// The tied head with bf16 GEMM inputs (the model's bf16 GEMM mode): the same loss, lse, dh and dE,
// with every chunk's logits GEMM h·E[v0:v0+c]ᵀ and both backward GEMMs (dh (+)= G·E[v0:v0+c],
// dE[v0:v0+c] += Gᵀ·h) taking bf16 inputs and accumulating in f32; the row statistics, softmax,
// loss and lse stay f32. h16 [N, H] and E16 [V, H] are the caller's bf16 copies of the final hidden
// states and the embedding (ops::cast_to_bf16); dh [N, H] written and dE [V, H] accumulated are f32.
// g16 (bf16, at least N·min(chunk, V) elements, its contents the op's own) receives each chunk's
// gradient G = (softmax − onehot)/count rounded to bf16, the backward GEMMs' left operand. Nothing
// is kept from the forward but the logits when one chunk covers V; the rows' math and order are
// cross_entropy_logits_forward's and cross_entropy_logits_backward's (with one chunk: the same bits
// as those two ops on the bf16-made logits). The workspace is the f32 op's.
CrossEntropyResult cross_entropy_tied_forward_backward_bf16(const Tensor& dh, const Tensor& dE,
                                                            const Tensor& lse, const Tensor& h16,
                                                            const Tensor& E16, const Tensor& targets,
                                                            const Tensor& workspace, const Tensor& g16,
                                                            const CrossEntropyOptions& opt = {});

// The forward alone of cross_entropy_tied_forward_backward_bf16 (evaluation with bf16 weights): the
// same loss and lse, bit for bit, from the same chunked logits GEMMs on bf16 h16 [N, H] and E16
// [V, H] with f32 accumulation and the same f32 row statistics; no gradient and no g16. The
// workspace is the f32 op's (its contents on return are the op's own).
CrossEntropyResult cross_entropy_tied_forward_bf16(const Tensor& lse, const Tensor& h16, const Tensor& E16,
                                                   const Tensor& targets, const Tensor& workspace,
                                                   const CrossEntropyOptions& opt = {});

// The loss from logits [N, V] the caller made itself (the model's bf16 head GEMM): lse [N] receives
// each row's logsumexp, the logits are left as they are; N i32 targets (any shape), each in [0, V)
// or ignore_index. Same row math and order as the fused forward's single chunk.
CrossEntropyResult cross_entropy_logits_forward(const Tensor& lse, const Tensor& logits, const Tensor& targets,
                                                int32_t ignore_index = -100);

// Turns materialized logits [N, V] (cross_entropy_logits_forward's input) into the gradient of the mean
// cross-entropy in place: row i becomes (softmax(logits_i) − onehot(target_i)) / count, from the
// rows' logsumexp lse [N] and N i32 targets (any shape); rows whose target is ignore_index become 0. `count` is the number of
// non-ignored rows (CrossEntropyResult::count).
void cross_entropy_logits_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t count,
                                   int32_t ignore_index = -100);

}  // namespace zaya::ops
