// The skip class as a passthrough ("mixture of depths"), forward and backward: the MoE block of
// Zyphra's legacy ZAYA1 layout (the released ZAYA1-base) outputs, for a token whose router chose
// the skip class (index E), p_skip times the token's MoE input (the post-attention RMSNorm's
// output), where transformers' native ZayaForCausalLM outputs 0 (docs/model.md, "MoE";
// docs/legacy-import.md, "The skip class"). The model calls these only with
// ModelConfig::skip_passthrough; ops/moe.h's route/unpermute stay the native behaviour and these
// write only the rows of skipped tokens (choice[n] == E), so the two compose:
//
//   forward         out[n] = p[n, E] · x[n]
//   into x          dx[n] += p[n, E] · dout[n]
//   into the router dlogits[n, e] = s·p_E·(δ_Ee − p_e), s = ⟨dout[n], x[n]⟩ (through p_skip and the softmax)
//
// p_skip is the unbiased softmax probability (the balancing biases only choose), as the legacy
// router's gathered probability is. Rows of routed tokens are left untouched by all three. x, out,
// dout, dx [N, H]; probs and dlogits [N, E+1]; choice [N] i32; all f32.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// out[n] = p[n, E]·x[n] for the skipped tokens; other rows of out unchanged.
void moe_skip_forward(const Tensor& out, const Tensor& x, const Tensor& probs, const Tensor& choice, int64_t N,
                      int64_t E, int64_t H);
// dx[n] += p[n, E]·dout[n] for the skipped tokens; other rows of dx unchanged.
void moe_skip_input_backward(const Tensor& dx, const Tensor& dout, const Tensor& probs, const Tensor& choice,
                             int64_t N, int64_t E, int64_t H);
// dlogits[n, :] = ⟨dout[n], x[n]⟩·p_E·(δ_Ee − p_e) for the skipped tokens (written, not added: the
// native moe_route_backward leaves those rows 0); other rows unchanged. The dot product is summed
// in h order on the CPU and in a warp's fixed butterfly on CUDA (deterministic on each).
void moe_skip_router_backward(const Tensor& dlogits, const Tensor& dout, const Tensor& x, const Tensor& probs,
                              const Tensor& choice, int64_t N, int64_t E, int64_t H);

}  // namespace zaya::ops
