// Every GEMM of one training step of a ZAYA1 model, from the config alone: the shapes
// `zaya bench gemm --shapes model:CONFIG` times and the shapes the step-time model prices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/model/config.h"
#include "zaya/sizing/hardware.h"

namespace zaya::sizing {

enum class GemmPass { forward, backward_data, backward_weight };
const char* gemm_pass_name(GemmPass p);  // "fwd", "bwd_data", "bwd_weight"

// C[M,N] = op(A)[M,K] op(B)[K,N], run `count` times per step (layers, experts).
struct ModelGemm {
  std::string name;  // "qkv_proj", "o_proj", "router.down_proj", ..., "expert.gate_up", "lm_head"
  GemmPass pass = GemmPass::forward;
  int64_t m = 0, n = 0, k = 0;
  int64_t count = 1;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(count);
  }
};

// A linear layer y[T, out] = x[T, in] W^T takes three GEMMs per step: forward (M=T, N=out, K=in),
// backward data dx = dy W (M=T, N=in, K=out) and backward weight dW = dy^T x (M=out, N=in, K=T).
// Projections: fused qkv (out nq·hd + 2·nkv·hd: q, k and the two half-width v projections), o_proj,
// router down_proj / fc1 / fc2 / out_proj, per layer; experts: gate_up (out 2I) and down (out H)
// at T/E rows each (balanced routing), per layer and expert; the tied LM head (out V) once.
// Attention's score and value products are not GEMMs of this list (a fused kernel): see
// attention_flops. `top_k` experts per token (a sizing-only knob for the MoE-width sweep; the model
// is top-1) puts tokens·k/E rows on each expert.
std::vector<ModelGemm> model_gemms(const model::ModelConfig& c, int64_t tokens, int64_t top_k = 1);
// Attention score + value FLOPs of one training step: 6 · L · tokens · seq · nq · hd (the
// convention of model::training_flops_per_token).
double attention_flops(const model::ModelConfig& c, int64_t tokens, int64_t seq);

// Seconds of GEMM compute for one step: each GEMM at gemm_rate(profile, its size), plus
// attention at the rate of a [seq, seq, hd] GEMM.
double predicted_compute_seconds(const model::ModelConfig& c, int64_t tokens, int64_t seq, const HardwareProfile& hw,
                                 int64_t top_k = 1);

}  // namespace zaya::sizing
