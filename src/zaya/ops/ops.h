// The op API: every ZAYA1 op with its forward and backward (DESIGN.md, "Engine principles").
// One header per op family; this one includes them all.
#pragma once

#include "zaya/ops/attention.h"      // causal GQA attention (tiled online softmax), decode against a KV cache
#include "zaya/ops/cca.h"            // CCA convolutions, mean skip, value shift, QK norm with key temperature
#include "zaya/ops/dense.h"          // linear, embedding, RMSNorm, residual scaling, activations, softmax
#include "zaya/ops/gemm.h"           // GEMM: NN/NT/TN/TT, batched, grouped, f32 and bf16 inputs
#include "zaya/ops/loss.h"           // cross-entropy fused with the tied LM head, vocabulary-chunked
#include "zaya/ops/moe.h"            // router softmax + biased top-1, expert permutation and un-permutation
#include "zaya/ops/moe_skip.h"       // the skip class as a passthrough (the legacy ZAYA1 layout's MoE)
#include "zaya/ops/newton_schulz.h"  // Muon's orthogonalization
#include "zaya/ops/optim_ops.h"      // global grad norm, clipping, AdamW update
#include "zaya/ops/rope.h"           // partial rotate-half RoPE with a position offset
