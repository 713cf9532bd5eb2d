// Copies between parts of tensors, for code above the ops that must move data without touching
// tensor memory itself (the cached decoder's K/V cache and conv state): a device backend does them
// on its stream.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// dst[dst_row + i, dst_col + j] = src[src_row + i, src_col + j] for i < rows, j < cols, each tensor
// seen as a matrix of its last dimension's columns ([numel / last, last]). Same dtype and device;
// the blocks must lie inside both tensors and must not overlap.
void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols);

// dst[dst_row + i, dst_col + j] += src[src_row + i, src_col + j], f32, the same block rules as
// copy_block: how a context-parallel rank adds the gradients its neighbours computed for its
// tokens (the CCA halo's) into its own.
void add_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
               int64_t src_col, int64_t rows, int64_t cols);

}  // namespace zaya::ops
