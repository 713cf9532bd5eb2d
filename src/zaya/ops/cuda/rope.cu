// CUDA kernel behind zaya/ops/rope.h (arguments checked by the front in ops/rope.cc): partial
// rotate-half RoPE at positions t + pos_offset. Forward and backward are the same kernel, the
// backward rotating by −φ. One thread per (token, head, j) with j < hd − rot/2: j < rot/2 rotates the
// pair (j, j + rot/2), the rest copy the pass-through dims rot..hd−1 (skipped in place). Each thread
// reads both elements of its pair before writing them, so y may be x. The rotation is
// math::rope_rotate, the CPU's float operations in its order: bitwise the CPU's result.
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/sequence_cuda.h"
#include "zaya/ops/sequence_math.h"

namespace zaya::ops::cuda {
namespace {

__global__ void rope_kernel(float* y, const float* x, const float* cos, const float* sin, int64_t rot, int64_t T,
                            int64_t heads, int64_t hd, int64_t pos_offset, float sign, int64_t n) {
  const int64_t half = rot / 2, per_head = hd - half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = k % per_head, row = k / per_head;  // row = (token, head)
    const int64_t token = row / heads, pos = token % T + pos_offset;
    const float* xi = x + row * hd;
    float* yo = y + row * hd;
    if (j < half) {
      const math::Pair r = math::rope_rotate(xi[j], xi[j + half], cos[pos * half + j], sin[pos * half + j], sign);
      yo[j] = r.lo;
      yo[j + half] = r.hi;
    } else if (yo != xi) {
      yo[j + half] = xi[j + half];  // dims rot .. hd−1 pass through
    }
  }
}

}  // namespace

void rope_apply(const Tensor& y, const Tensor& x, const RopeTable& table, int64_t B, int64_t T, int64_t heads,
                int64_t hd, int64_t pos_offset, float sign) {
  const std::string_view op = sign > 0 ? "rope_forward" : "rope_backward";
  auto& ctx = context_for(op);
  const int64_t n = B * T * heads * (hd - table.rot / 2);
  rope_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(y.data<float>(), x.data<float>(),
                                                               table.cos.data<float>(), table.sin.data<float>(),
                                                               table.rot, T, heads, hd, pos_offset, sign, n);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
