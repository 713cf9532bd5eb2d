// CUDA kernels for the router state's depth averaging (router_state.h; fronts in
// ops/router_state.cc), fp32:
//   forward  r += s ⊙ r_prev;
//   backward dr += carried; then with EDA: ds += Σ_rows dr ⊙ r_prev, carried = dr ⊙ s.
// The column sum goes in fixed chunk order (launch.cuh): bitwise the same run to run.
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/scale_bias_eda_cuda.h"

namespace zaya::ops::cuda {
namespace {

__global__ void eda_forward_kernel(float* r, const float* r_prev, const float* s, int64_t n, int64_t f) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * f;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    r[k] += s[k % f] * r_prev[k];
}

// dr += carried; carried = dr ⊙ s where the layer has EDA (s non-null).
__global__ void eda_backward_kernel(float* dr, float* carried, const float* s, int64_t n, int64_t f) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * f;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d = dr[k] + carried[k];
    dr[k] = d;
    if (s) carried[k] = d * s[k % f];
  }
}

struct EdaDsTerm {  // dr ⊙ r_prev, dr already holding its carry
  const float *dr, *r_prev;
  int64_t f;
  __device__ float operator()(int64_t i, int64_t j) const { return dr[i * f + j] * r_prev[i * f + j]; }
};
struct EdaDsFinish {
  float* ds;
  __device__ void operator()(int64_t j, float total) const { ds[j] += total; }
};

}  // namespace

void eda_forward(const Tensor& r, const Tensor& r_prev, const Tensor& s) {
  constexpr std::string_view op = "eda_forward";
  auto& ctx = context_for(op);
  const int64_t n = r.size(0), f = r.size(1);
  if (n * f == 0) return;
  eda_forward_kernel<<<blocks_for(n * f), kThreads, 0, stream_of(ctx)>>>(r.data<float>(), r_prev.data<float>(),
                                                                          s.data<float>(), n, f);
  check_launch(op);
}

void eda_backward(const Tensor& dr, const Tensor& carried, const Tensor& ds, const Tensor& r_prev,
                  const Tensor& s) {
  constexpr std::string_view op = "eda_backward";
  auto& ctx = context_for(op);
  const int64_t n = dr.size(0), f = dr.size(1);
  const bool eda = r_prev.defined();
  if (n * f > 0) {
    eda_backward_kernel<<<blocks_for(n * f), kThreads, 0, stream_of(ctx)>>>(
        dr.data<float>(), carried.data<float>(), eda ? s.data<float>() : nullptr, n, f);
    check_launch(op);
  }
  if (eda) column_sums(op, ctx, n, f, EdaDsTerm{dr.data<float>(), r_prev.data<float>(), f}, EdaDsFinish{ds.data<float>()});
}

}  // namespace zaya::ops::cuda
