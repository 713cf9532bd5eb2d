// CUDA kernels behind zaya/ops/moe.h (moe.cu), with the fronts' arguments; the fronts in ops/moe.cc
// check them and call these for CUDA tensors. A plain C++ header (no CUDA types), included only
// where the build has CUDA (ZAYA_HAVE_CUDA). fp32 activations, i32 indices.
//
// The routing decisions and the plan are those of the CPU kernels exactly (the row math is shared:
// ops/router_math.h; the plan is a stable counting sort without order-dependent atomics). The
// permutation kernels trust pos/src as moe_plan made them.
#pragma once

#include <cstdint>
#include <string_view>

#include "zaya/core/tensor.h"

namespace zaya::ops::cuda {

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               const Tensor& beta, int64_t N, int64_t E);
void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs,
                        const Tensor& choice, int64_t N, int64_t E);
// Returns M to the host: the one synchronizing call of the MoE layer (the host sizes the expert
// GEMMs by it). A choice outside [0, E] throws zaya::Error naming the first such token, as the CPU
// front does, after the sync; its token then has pos −1 and no row.
int64_t moe_plan(const Tensor& counts, const Tensor& offsets, const Tensor& pos, const Tensor& src,
                 const Tensor& choice, int64_t N, int64_t E);
// xp[r] = x[src[r]] for r0 ≤ r < r1; `op` names the front (moe_gather or moe_gather_rows) in errors.
void moe_gather(const Tensor& xp, const Tensor& x, const Tensor& src, int64_t r0, int64_t r1, int64_t H,
                std::string_view op);
void moe_gather_backward(const Tensor& dx, const Tensor& dxp, const Tensor& pos, int64_t N, int64_t H);
void moe_unpermute(const Tensor& out, const Tensor& y, const Tensor& weight, const Tensor& pos, int64_t N,
                   int64_t H);
void moe_unpermute_backward(const Tensor& dy, const Tensor& dweight, const Tensor& dout, const Tensor& y,
                            const Tensor& weight, const Tensor& pos, int64_t N, int64_t H);

}  // namespace zaya::ops::cuda
