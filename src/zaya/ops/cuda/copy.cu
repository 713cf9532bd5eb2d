// Block copies and additions on a GPU, queued on the calling thread's compute stream (no host
// synchronization). copy_block is cudaMemcpy2DAsync with the two tensors' row pitches; add_block a
// kernel with one thread per element of the block, each adding once, so its result is bitwise the
// CPU's (cpu/copy_cpu.cc).
#include <cuda_runtime_api.h>

#include "zaya/core/error.h"
#include "zaya/ops/cuda/copy_cuda.h"
#include "zaya/ops/cuda/launch.cuh"

namespace zaya::ops::cuda {

void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols) {
  auto& ctx = context_for("copy_block");
  const int64_t e = static_cast<int64_t>(dtype_size(dst.dtype()));
  const int64_t dw = dst.size(-1), sw = src.size(-1);
  char* d = static_cast<char*>(dst.raw()) + (dst_row * dw + dst_col) * e;
  const char* s = static_cast<const char*>(src.raw()) + (src_row * sw + src_col) * e;
  const cudaError_t err =
      cudaMemcpy2DAsync(d, static_cast<size_t>(dw * e), s, static_cast<size_t>(sw * e), static_cast<size_t>(cols * e),
                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_of(ctx));
  if (err != cudaSuccess) throw Error(str("ops::copy_block: cudaMemcpy2DAsync failed: ", cudaGetErrorString(err)));
}

namespace {
// d[i·dw + j] += s[i·sw + j] for the block's rows × cols elements, grid-striding, j fastest.
__global__ void add_block_kernel(float* d, int64_t dw, const float* s, int64_t sw, int64_t rows, int64_t cols) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < rows * cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, j = e % cols;
    d[i * dw + j] += s[i * sw + j];
  }
}
}  // namespace

void add_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
               int64_t src_col, int64_t rows, int64_t cols) {
  constexpr std::string_view op = "add_block";
  auto& ctx = context_for(op);
  const int64_t dw = dst.size(-1), sw = src.size(-1);
  float* d = static_cast<float*>(dst.raw()) + dst_row * dw + dst_col;
  const float* s = static_cast<const float*>(src.raw()) + src_row * sw + src_col;
  add_block_kernel<<<blocks_for(rows * cols), kThreads, 0, stream_of(ctx)>>>(d, dw, s, sw, rows, cols);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
