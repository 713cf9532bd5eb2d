#include <cuda_runtime.h>

#include "zaya/core/error.h"
#include "zaya/core/philox.h"
#include "zaya/core/random.h"

namespace zaya::cuda {
namespace {

__global__ void philox_fill_kernel(float* out, int64_t n, uint64_t seed, uint64_t offset, bool normal,
                                   float a, float b) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint64_t idx = offset + static_cast<uint64_t>(i);
  out[i] = normal ? a + b * philox_normal(seed, idx) : a + (b - a) * philox_uniform(seed, idx);
}

}  // namespace

void philox_fill_f32(float* out, int64_t n, uint64_t seed, uint64_t offset, bool normal, float a, float b) {
  if (n == 0) return;
  int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  philox_fill_kernel<<<static_cast<unsigned>(blocks), threads>>>(out, n, seed, offset, normal, a, b);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) throw Error(str("philox fill kernel failed: ", cudaGetErrorString(err)));
}

}  // namespace zaya::cuda
