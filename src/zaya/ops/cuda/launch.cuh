// What the CUDA op kernels share: the calling thread's device context, launch checks, grid sizes,
// deterministic block reductions and the deterministic column sums of parameter gradients.
//
// Determinism: no atomics. A block reduction adds lanes in a fixed butterfly and the warps' sums in
// warp order; a column sum over rows goes by fixed chunks of kChunkRows rows, each summed in row
// order by one thread, and the chunks' partials are then added in chunk order by one thread per
// column. Every order depends only on the shapes, so results are bitwise the same run to run.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "zaya/core/cuda_context.h"
#include "zaya/core/error.h"

namespace zaya::ops::cuda {

// The calling thread's device context, its error naming the op ("ops::silu_forward: the CUDA device
// context needs a GPU, but no GPU is present (...)") when there is none.
inline zaya::cuda::DeviceContext& context_for(std::string_view op) {
  try {
    return zaya::cuda::current();
  } catch (const Error& e) {
    throw Error(str("ops::", op, ": ", e.what()));
  }
}
inline cudaStream_t stream_of(zaya::cuda::DeviceContext& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

// Throws when the launch just made failed (a bad configuration); faults inside a kernel surface at
// the next synchronizing call, as CUDA reports them.
inline void check_launch(std::string_view op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(str("ops::", op, ": kernel launch failed: ", cudaGetErrorString(err)));
}

constexpr int kThreads = 256;  // threads per block for every kernel here
// Blocks for a grid-stride loop over n items: enough to fill any current GPU, capped so that the
// grid size fits an unsigned int for any n.
inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, int64_t{1} << 20));
}
// One block per row, at most 2^20 blocks (the kernels grid-stride over more rows).
inline unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, int64_t{1} << 20));
}

// Σ v over the block's kThreads threads, the same total in every thread. `shared` holds kThreads/32
// floats. The lanes add in a fixed butterfly and the warps' sums in warp order.
__device__ inline float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  __syncthreads();  // `shared` may be reused right after
  return total;
}
__device__ inline float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, shared[w]);
  __syncthreads();
  return m;
}

// ---------------------------------------------------------------------------------------------
// Column sums over rows: finish(j, Σ_i term(i, j)) for each column j of `cols`.

constexpr int64_t kChunkRows = 64;

// partial[c·cols + j] = Σ_{i in chunk c, in row order} term(i, j).
template <class Term>
__global__ void chunk_column_sums_kernel(float* partial, int64_t rows, int64_t cols, int64_t chunks, Term term) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t i1 = min(rows, (c + 1) * kChunkRows);
    float s = 0.0f;
    for (int64_t i = c * kChunkRows; i < i1; ++i) s += term(i, j);
    partial[c * cols + j] = s;
  }
}

// finish(j, Σ_c partial[c·cols + j]), the chunks added in order.
template <class Finish>
__global__ void finish_column_sums_kernel(const float* partial, int64_t cols, int64_t chunks, Finish finish) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * cols + j];
    finish(j, s);
  }
}

// Term: a functor with `__device__ float operator()(int64_t i, int64_t j) const`; Finish: one with
// `__device__ void operator()(int64_t j, float total) const` (typically out[j] += total). The
// partials live in the context's scratch.
template <class Term, class Finish>
void column_sums(std::string_view op, zaya::cuda::DeviceContext& ctx, int64_t rows, int64_t cols, Term term,
                 Finish finish) {
  if (cols == 0) return;
  const int64_t chunks = std::max<int64_t>(1, (rows + kChunkRows - 1) / kChunkRows);
  auto* partial = static_cast<float*>(ctx.scratch(static_cast<size_t>(chunks * cols) * sizeof(float)));
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  chunk_column_sums_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(partial, rows, cols, chunks, term);
  check_launch(op);
  finish_column_sums_kernel<<<blocks_for(cols), kThreads, 0, stream_of(ctx)>>>(partial, cols, chunks, finish);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
