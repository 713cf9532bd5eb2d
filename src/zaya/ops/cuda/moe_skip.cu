// CUDA kernels for the skip-class passthrough (math in ops/moe_skip.h; arguments checked by the
// fronts in ops/moe_skip.cc). The per-element products and sums are ops/moe_skip_math.h's and the
// router's ops/router_math.h's, the CPU kernels' own code, so out and dx are bitwise the CPU's;
// only ⟨dout, x⟩ of the router's gradient is a sum in another order (a warp's fixed butterfly).
// Rows of routed tokens are not touched; a block (forward, input backward) or a warp (router
// backward) that finds a routed token moves on after one read of its choice.
#include "zaya/ops/cuda/moe_skip_cuda.h"

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/moe_skip_math.h"
#include "zaya/ops/router_math.h"

namespace zaya::ops::cuda {
namespace {

// One block per token row (grid-stride over rows), its threads the row's columns.
__global__ void moe_skip_forward_kernel(float* out, const float* x, const float* probs, const int32_t* choice,
                                        int64_t N, int64_t K, int64_t H) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    if (choice[n] != K - 1) continue;
    const float p = probs[n * K + K - 1];
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) out[n * H + h] = math::skip_passthrough(p, x[n * H + h]);
  }
}

__global__ void moe_skip_input_backward_kernel(float* dx, const float* dout, const float* probs,
                                               const int32_t* choice, int64_t N, int64_t K, int64_t H) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    if (choice[n] != K - 1) continue;
    const float p = probs[n * K + K - 1];
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
      dx[n * H + h] = math::skip_passthrough_dx(dx[n * H + h], p, dout[n * H + h]);
  }
}

// One warp per token: s = ⟨dout[n], x[n]⟩, the lanes' partial sums (each in h order) added in a
// fixed butterfly, then the K logit gradients by the lanes.
__global__ void moe_skip_router_backward_kernel(float* dlogits, const float* dout, const float* x,
                                                const float* probs, const int32_t* choice, int64_t N, int64_t K,
                                                int64_t H) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; n < N; n += warps) {
    if (choice[n] != K - 1) continue;
    float s = 0.0f;
    for (int64_t h = lane; h < H; h += 32) s = __fadd_rn(s, __fmul_rn(dout[n * H + h], x[n * H + h]));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float* p = probs + n * K;
    const float a = __fmul_rn(s, p[K - 1]);
    for (int64_t e = lane; e < K; e += 32) dlogits[n * K + e] = math::route_logit_grad(a, p[e], e == K - 1);
  }
}

unsigned warp_blocks(int64_t N) {
  return static_cast<unsigned>(std::clamp<int64_t>((N + kThreads / 32 - 1) / (kThreads / 32), 1, int64_t{1} << 20));
}

}  // namespace

void moe_skip_forward(const Tensor& out, const Tensor& x, const Tensor& probs, const Tensor& choice, int64_t N,
                      int64_t E, int64_t H) {
  constexpr std::string_view op = "moe_skip_forward";
  auto& ctx = context_for(op);
  moe_skip_forward_kernel<<<row_blocks(N), kThreads, 0, stream_of(ctx)>>>(
      out.data<float>(), x.data<float>(), probs.data<float>(), choice.data<int32_t>(), N, E + 1, H);
  check_launch(op);
}

void moe_skip_input_backward(const Tensor& dx, const Tensor& dout, const Tensor& probs, const Tensor& choice,
                             int64_t N, int64_t E, int64_t H) {
  constexpr std::string_view op = "moe_skip_input_backward";
  auto& ctx = context_for(op);
  moe_skip_input_backward_kernel<<<row_blocks(N), kThreads, 0, stream_of(ctx)>>>(
      dx.data<float>(), dout.data<float>(), probs.data<float>(), choice.data<int32_t>(), N, E + 1, H);
  check_launch(op);
}

void moe_skip_router_backward(const Tensor& dlogits, const Tensor& dout, const Tensor& x, const Tensor& probs,
                              const Tensor& choice, int64_t N, int64_t E, int64_t H) {
  constexpr std::string_view op = "moe_skip_router_backward";
  auto& ctx = context_for(op);
  moe_skip_router_backward_kernel<<<warp_blocks(N), kThreads, 0, stream_of(ctx)>>>(
      dlogits.data<float>(), dout.data<float>(), x.data<float>(), probs.data<float>(), choice.data<int32_t>(), N,
      E + 1, H);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
