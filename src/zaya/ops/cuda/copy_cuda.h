// The CUDA kernels behind zaya/ops/copy.h (copy.cu): a strided device-to-device copy and a block
// addition (f32) on the calling thread's stream. A plain C++ header, included only where the build
// has CUDA.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops::cuda {

void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols);
void add_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
               int64_t src_col, int64_t rows, int64_t cols);

}  // namespace zaya::ops::cuda
