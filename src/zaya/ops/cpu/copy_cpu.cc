// Block copies on the CPU: one memcpy per row (or one for rows that are whole and contiguous).
#include "zaya/ops/cpu/copy_cpu.h"

#include <cstring>

namespace zaya::ops::cpu {

void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols) {
  const size_t e = dtype_size(dst.dtype());
  const int64_t dw = dst.size(-1), sw = src.size(-1);
  auto* d = static_cast<char*>(dst.raw()) + (dst_row * dw + dst_col) * static_cast<int64_t>(e);
  const auto* s = static_cast<const char*>(src.raw()) + (src_row * sw + src_col) * static_cast<int64_t>(e);
  if (cols == dw && cols == sw) {
    std::memcpy(d, s, static_cast<size_t>(rows * cols) * e);
    return;
  }
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(d + i * dw * static_cast<int64_t>(e), s + i * sw * static_cast<int64_t>(e), static_cast<size_t>(cols) * e);
}

void add_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
               int64_t src_col, int64_t rows, int64_t cols) {
  const int64_t dw = dst.size(-1), sw = src.size(-1);
  float* d = dst.data<float>() + dst_row * dw + dst_col;
  const float* s = src.data<float>() + src_row * sw + src_col;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) d[i * dw + j] += s[i * sw + j];
}

}  // namespace zaya::ops::cpu
