// What a shape costs when it is served: prefill time for a prompt, decode latency and throughput
// per batch size (a roofline: bytes read per step against memory bandwidth, FLOPs against the GEMM
// rates, whichever is larger), and the KV cache per sequence against full multi-head attention.
// docs/sizing.md ("Serving") states every formula; tests/sizing/test_decode_roofline.cc checks the
// byte and FLOP counts against the model's own parameters and the decoder's cache tensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "zaya/model/config.h"
#include "zaya/sizing/hardware.h"

namespace zaya::sizing {

// Expected number of distinct experts that `tokens` tokens hit in one layer when each picks
// `top_k` distinct experts uniformly at random among `experts`: E · (1 − (1 − k/E)^n). For top-1
// this is E · (1 − (1 − 1/E)^n): an expert is missed by one token with probability 1 − 1/E, by all
// n independently with (1 − 1/E)^n. Balanced routing is what the balancing biases aim for; a
// skewed router hits fewer experts, so this is the bytes-heavier (pessimistic) case for decode.
double expected_distinct_experts(int64_t experts, double tokens, int64_t top_k = 1);

struct ServeOptions {
  int64_t weight_bytes = 2;  // bytes per weight element read (bf16 serving; zaya's CPU decoder reads f32: 4)
  int64_t cache_bytes = 2;   // bytes per KV-cache and CCA-state element (bf16; the CPU decoder keeps f32: 4)
  // Experts each token runs (a sizing-only knob for the MoE-width sweep; zaya's model is top-1).
  // A token's FLOPs count k experts; the distinct experts per layer use k in the formula above.
  int64_t top_k = 1;
  // Price the experts by the profile's experts_table when it has this shape (DecodeStep). Off where
  // shapes are compared (--suggest, --sweep-experts): the table holds the original shape only, and
  // one row measured against others modelled would rank the pricing, not the shapes.
  bool measured_experts = true;
};

// The weights a decode step reads, split by what they are; bytes at o.weight_bytes.
struct WeightBytes {
  double dense = 0;    // every parameter outside the experts and the embedding (attention, router,
                       // norms, scales, conv kernels), plus the router's balancing biases [E+1]/layer
  double experts = 0;  // L · distinct experts · one expert's gate_up and down matrices
  double lm_head = 0;  // the tied embedding V·H, read once for the head (the B input rows are in it)
  double total() const { return dense + experts + lm_head; }
};
// Weights read when `distinct_experts` experts of each layer are hit (a count, may be fractional).
WeightBytes decode_weight_bytes(const model::ModelConfig& c, double distinct_experts, const ServeOptions& o);

// Decode state of one sequence at `context` cached positions: post-RoPE K and V (L · 2 · ctx ·
// nkv·hd) and the CCA state (L · (2 conv columns of C = (nq+nkv)·hd + the previous token's vd,
// nkv·hd/2)); and what full multi-head attention of the same width would cache: K and V of H/hd
// heads of hd, L · 2 · ctx · H.
struct CacheBytes {
  double kv = 0, cca_state = 0, mha_kv = 0;
  double total() const { return kv + cca_state; }
  double ratio_vs_mha() const { return mha_kv / kv; }
};
CacheBytes cache_bytes_per_sequence(const model::ModelConfig& c, int64_t context, const ServeOptions& o);

// Parameters one token's decode multiplies (2 FLOPs each): every non-expert, non-embedding
// parameter, top_k experts' matrices per layer, and the tied LM head (V·H).
double decode_params_per_token(const model::ModelConfig& c, int64_t top_k);

struct DecodeStep {
  int64_t batch = 0, context = 0;  // sequences, positions each attends over (cache incl. this token)
  double distinct_experts = 0;     // per layer
  WeightBytes weights;
  double kv_bytes = 0, state_bytes = 0;  // the batch's K/V cache read and CCA state read + written
  double flops = 0;  // 2·B·decode_params_per_token + attention 4·B·L·ctx·nq·hd (scores and values)
  double memory_s = 0, compute_s = 0;   // bytes / bandwidth; FLOPs at the GEMM rates
  // With a profile whose experts_table has this expert shape (measured_experts_seconds), the experts
  // op is priced by that measurement instead: experts_s = L · its seconds per layer, and memory_s
  // and compute_s cover the rest of the step (the experts' bytes and FLOPs taken out).
  bool experts_measured = false;
  double experts_s = 0;
  double step_s = 0;  // max(memory_s, compute_s) + experts_s: one new token per sequence
  double bytes() const { return weights.total() + kv_bytes + state_bytes; }
  double tokens_per_s() const { return step_s > 0 ? static_cast<double>(batch) / step_s : 0; }
  bool memory_bound() const { return memory_s >= compute_s; }
  // "memory" or "compute" (the larger roofline term), or "experts" when the measured experts op
  // takes longer than the rest of the step's roofline.
  const char* bound() const {
    return experts_s > std::max(memory_s, compute_s) ? "experts" : memory_bound() ? "memory" : "compute";
  }
};
// One decode step of `batch` sequences each at `context` positions. Times are 0 without a profile.
DecodeStep decode_step(const model::ModelConfig& c, int64_t batch, int64_t context, const HardwareProfile* hw,
                       const ServeOptions& o);

struct Prefill {
  int64_t prompt = 0;
  double distinct_experts = 0;
  double bytes = 0;  // weights at the experts the prompt hits + the K/V and CCA state written
  double flops = 0;  // 2·P·(params per token − V·H) + 2·V·H (logits of the last position only)
                     // + causal attention 2·L·nq·hd·P·(P+1)
  double memory_s = 0, compute_s = 0, time_s = 0;
};
// Prefill of one prompt of `prompt` tokens; compute priced GEMM by GEMM (model_gemms' forward
// shapes at P rows, the head at one row, attention at the rate of a [P, P, hd] GEMM).
Prefill prefill_cost(const model::ModelConfig& c, int64_t prompt, const HardwareProfile* hw, const ServeOptions& o);

struct ServeReport {
  ServeOptions options;
  int64_t prompt = 0, context = 0;
  Prefill prefill;
  std::vector<DecodeStep> decode;  // one per batch size
  CacheBytes cache;                // per sequence at `context`
  double all_weight_bytes = 0;     // every parameter (all experts) at weight_bytes: what a server holds
  int64_t max_batch = 0;           // sequences whose caches fit beside the weights (0 without a profile)
  bool has_hw = false;
  std::string hw_name;
  // How the decode rows price the experts: the measured experts op (the profile's experts_table)
  // or the roofline, and why not the measurement when the profile has a table that does not fit.
  std::string experts_pricing;
};
ServeReport serve_model(const model::ModelConfig& c, int64_t prompt, int64_t context,
                        const std::vector<int64_t>& batches, const HardwareProfile* hw, const ServeOptions& o);
std::string format_serve_report(const ServeReport& r);

}  // namespace zaya::sizing
