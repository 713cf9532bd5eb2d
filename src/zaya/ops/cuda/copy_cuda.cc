// Block copies on a GPU: cudaMemcpy2DAsync with the two tensors' row pitches, queued on the calling
// thread's compute stream (no host synchronization).
#include <cuda_runtime_api.h>

#include "zaya/core/cuda_context.h"
#include "zaya/core/error.h"
#include "zaya/ops/cuda/copy_cuda.h"

namespace zaya::ops::cuda {

void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols) {
  zaya::cuda::DeviceContext* ctx = nullptr;
  try {
    ctx = &zaya::cuda::current();
  } catch (const Error& e) {
    throw Error(str("ops::copy_block: ", e.what()));
  }
  const int64_t e = static_cast<int64_t>(dtype_size(dst.dtype()));
  const int64_t dw = dst.size(-1), sw = src.size(-1);
  char* d = static_cast<char*>(dst.raw()) + (dst_row * dw + dst_col) * e;
  const char* s = static_cast<const char*>(src.raw()) + (src_row * sw + src_col) * e;
  const cudaError_t err =
      cudaMemcpy2DAsync(d, static_cast<size_t>(dw * e), s, static_cast<size_t>(sw * e), static_cast<size_t>(cols * e),
                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(ctx->stream()));
  if (err != cudaSuccess) throw Error(str("ops::copy_block: cudaMemcpy2DAsync failed: ", cudaGetErrorString(err)));
}

}  // namespace zaya::ops::cuda
