// The gradient-wire kernels (grad_wire_cuda.h): streaming element loops, as the CPU's.
#include "zaya/ops/cuda/grad_wire_cuda.h"
#include "zaya/ops/cuda/launch.cuh"

namespace zaya::ops::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// wide += g (exact in f64 for the few micro-batch terms of a step), then g = 0.
__global__ void accumulate_wide_kernel(double* w, float* g, int64_t n) {
  GRID_STRIDE(i, n) {
    w[i] += static_cast<double>(g[i]);
    g[i] = 0.0f;
  }
}

// g = f32(wide · scale), rounded once; wide = 0.
__global__ void narrow_scaled_kernel(float* g, double* w, int64_t n, double scale) {
  GRID_STRIDE(i, n) {
    g[i] = static_cast<float>(w[i] * scale);
    w[i] = 0.0;
  }
}

__global__ void to_bf16_kernel(bf16* d, const float* s, int64_t n) {
  GRID_STRIDE(i, n) d[i] = to_bf16(s[i]);
}

__global__ void from_bf16_kernel(float* d, const bf16* s, int64_t n, float scale) {
  GRID_STRIDE(i, n) d[i] = to_float(s[i]) * scale;
}

}  // namespace

void accumulate_wide(const Tensor& wide, const Tensor& g) {
  constexpr std::string_view op = "accumulate_wide";
  auto& ctx = context_for(op);
  const int64_t n = g.numel();
  if (n == 0) return;
  accumulate_wide_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(wide.data<double>(), g.data<float>(), n);
  check_launch(op);
}

void narrow_scaled(const Tensor& g, const Tensor& wide, double scale) {
  constexpr std::string_view op = "narrow_scaled";
  auto& ctx = context_for(op);
  const int64_t n = g.numel();
  if (n == 0) return;
  narrow_scaled_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(g.data<float>(), wide.data<double>(), n, scale);
  check_launch(op);
}

void to_bf16_wire(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "to_bf16_wire";
  auto& ctx = context_for(op);
  const int64_t n = src.numel();
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(dst.data<bf16>(), src.data<float>(), n);
  check_launch(op);
}

void from_bf16_wire(const Tensor& dst, const Tensor& src, float scale) {
  constexpr std::string_view op = "from_bf16_wire";
  auto& ctx = context_for(op);
  const int64_t n = src.numel();
  if (n == 0) return;
  from_bf16_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(dst.data<float>(), src.data<bf16>(), n, scale);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
