// CUDA kernels for the bias-then-scale op (scale_bias.h; fronts in ops/scale_bias.cc), fp32:
// y = (x + b) ⊙ g.  dx = dy ⊙ g,  db += Σ_rows dy ⊙ g,  dg += Σ_rows dy ⊙ (x + b).
// The column sums go in fixed chunk order (launch.cuh): bitwise the same run to run.
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/scale_bias_eda_cuda.h"

namespace zaya::ops::cuda {
namespace {

__global__ void scale_bias_forward_kernel(float* y, const float* x, const float* b, const float* g, int64_t n,
                                          int64_t f) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * f;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = k % f;
    y[k] = (x[k] + b[j]) * g[j];
  }
}

__global__ void scale_bias_backward_dx_kernel(float* dx, const float* dy, const float* g, int64_t n, int64_t f) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * f;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[k] = dy[k] * g[k % f];
}

// Columns [0, f): dy ⊙ (x + b), for dg; [f, 2f): dy ⊙ g, for db (a sum of the products, as the CPU
// kernel adds them).
struct ScaleBiasTerm {
  const float *dy, *x, *b, *g;
  int64_t f;
  __device__ float operator()(int64_t i, int64_t c) const {
    if (c < f) return dy[i * f + c] * (x[i * f + c] + b[c]);
    return dy[i * f + c - f] * g[c - f];
  }
};
struct ScaleBiasFinish {
  float *dg, *db;
  int64_t f;
  __device__ void operator()(int64_t c, float total) const {
    if (c < f) dg[c] += total;
    else db[c - f] += total;
  }
};

}  // namespace

void scale_bias_forward(const Tensor& y, const Tensor& x, const Tensor& b, const Tensor& g) {
  constexpr std::string_view op = "scale_bias_forward";
  auto& ctx = context_for(op);
  const int64_t n = x.size(0), f = x.size(1);
  if (n * f == 0) return;
  scale_bias_forward_kernel<<<blocks_for(n * f), kThreads, 0, stream_of(ctx)>>>(y.data<float>(), x.data<float>(),
                                                                                 b.data<float>(), g.data<float>(), n, f);
  check_launch(op);
}

void scale_bias_backward(const Tensor& dx, const Tensor& db, const Tensor& dg, const Tensor& dy, const Tensor& x,
                         const Tensor& b, const Tensor& g) {
  constexpr std::string_view op = "scale_bias_backward";
  auto& ctx = context_for(op);
  const int64_t n = x.size(0), f = x.size(1);
  if (f == 0) return;
  if (n > 0) {
    scale_bias_backward_dx_kernel<<<blocks_for(n * f), kThreads, 0, stream_of(ctx)>>>(dx.data<float>(), dy.data<float>(),
                                                                                       g.data<float>(), n, f);
    check_launch(op);
  }
  column_sums(op, ctx, n, 2 * f, ScaleBiasTerm{dy.data<float>(), x.data<float>(), b.data<float>(), g.data<float>(), f},
              ScaleBiasFinish{dg.data<float>(), db.data<float>(), f});
}

}  // namespace zaya::ops::cuda
