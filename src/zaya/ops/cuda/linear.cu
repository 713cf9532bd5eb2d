// CUDA linear layers (dense.h; fronts in ops/dense.cc), composed as the CPU's (cpu/dense_cpu.cc):
//   forward   y = x·Wᵀ (+ b)
//   backward  dx (+)= dy·W,  dW += dyᵀ·x,  db += Σ_rows dy
// with bf16 x and W, the products take dy's bf16 copy (dy_bf16, rounded by cast_to_bf16: the CPU's
// bits). The GEMMs are ops::gemm's; the bias is added after the product (one addition per
// element, as on the CPU), db is a column sum in fixed chunk order (launch.cuh): deterministic.
#include "zaya/ops/cuda/dense_cuda.h"
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/linear_cuda.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cuda {
namespace {

// y[i, j] += b[j]: rows on the grid's y, columns on x (no index division per element).
__global__ void add_bias_kernel(float* y, const float* b, int64_t n, int64_t out) {
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y)
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < out;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x)
      y[i * out + j] += b[j];
}

struct DyTerm {  // dy[i, j]
  const float* dy;
  int64_t out;
  __device__ float operator()(int64_t i, int64_t j) const { return dy[i * out + j]; }
};
struct AddTo {
  float* out;
  __device__ void operator()(int64_t j, float total) const { out[j] += total; }
};

}  // namespace

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b) {
  constexpr std::string_view op = "linear_forward";
  auto& ctx = context_for(op);
  const int64_t n = x.size(0), out = W.size(0);
  ops::gemm(y, x, Trans::N, W, Trans::T, 1.0f, 0.0f);
  if (!b.defined() || n * out == 0) return;
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>((out + kThreads - 1) / kThreads, 1, 1024)),
                  static_cast<unsigned>(std::clamp<int64_t>(n, 1, 65535)));
  add_bias_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(y.data<float>(), b.data<float>(), n, out);
  check_launch(op);
}

void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx) {
  constexpr std::string_view op = "linear_backward";
  auto& ctx = context_for(op);
  const int64_t n = x.size(0), out = W.size(0);
  // The GEMM operand that stands for dy: dy itself (f32), or its bf16 copy next to bf16 x and W.
  Tensor g = dy;
  if (x.dtype() == DType::bf16) {
    cast_to_bf16(dy_bf16, dy);
    g = dy_bf16;
  }
  if (dx.defined()) ops::gemm(dx, g, Trans::N, W, Trans::N, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  if (dW.defined()) ops::gemm(dW, g, Trans::T, x, Trans::N, 1.0f, 1.0f);
  if (db.defined()) column_sums(op, ctx, n, out, DyTerm{dy.data<float>(), out}, AddTo{db.data<float>()});
}

}  // namespace zaya::ops::cuda
