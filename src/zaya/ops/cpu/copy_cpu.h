// The CPU side of zaya/ops/copy.h (arguments already checked there).
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops::cpu {

void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols);

void add_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
               int64_t src_col, int64_t rows, int64_t cols);

}  // namespace zaya::ops::cpu
