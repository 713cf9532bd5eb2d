// Argument checks and dispatch for block copies (kernels in cpu/copy_cpu.cc and cuda/copy.cu).
#include "zaya/ops/copy.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/copy_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/copy_cuda.h"
#endif

namespace zaya::ops {

namespace {
// The block rules both copies share; false when the block is empty.
bool check_blocks(std::string_view op, const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src,
                  int64_t src_row, int64_t src_col, int64_t rows, int64_t cols) {
  check::defined(op, "dst", dst);
  check::dtype(op, "src", src, dst.dtype());
  ZAYA_CHECK(dst.ndim() >= 1 && src.ndim() >= 1, op, ": dst ", dst.str(), " and src ", src.str(),
             " need at least one dimension");
  const int64_t dw = dst.size(-1), sw = src.size(-1);
  const int64_t dh = dw ? dst.numel() / dw : 0, sh = sw ? src.numel() / sw : 0;
  ZAYA_CHECK(rows >= 0 && cols >= 0, op, ": rows and cols must be >= 0, found ", rows, " x ", cols);
  ZAYA_CHECK(dst_row >= 0 && dst_col >= 0 && dst_row + rows <= dh && dst_col + cols <= dw, op, ": the block [",
             dst_row, ", ", dst_row + rows, ") x [", dst_col, ", ", dst_col + cols, ") is outside dst ",
             dst.str(), " seen as [", dh, ", ", dw, "]");
  ZAYA_CHECK(src_row >= 0 && src_col >= 0 && src_row + rows <= sh && src_col + cols <= sw, op, ": the block [",
             src_row, ", ", src_row + rows, ") x [", src_col, ", ", src_col + cols, ") is outside src ",
             src.str(), " seen as [", sh, ", ", sw, "]");
  return rows > 0 && cols > 0;
}
}  // namespace

void copy_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
                int64_t src_col, int64_t rows, int64_t cols) {
  constexpr std::string_view op = "copy_block";
  const OpDevice on(op, {{"dst", dst}, {"src", src}});
  if (!check_blocks(op, dst, dst_row, dst_col, src, src_row, src_col, rows, cols)) return;
  if (on.cpu()) return cpu::copy_block(dst, dst_row, dst_col, src, src_row, src_col, rows, cols);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::copy_block(dst, dst_row, dst_col, src, src_row, src_col, rows, cols);
#endif
  on.no_kernel();
}

void add_block(const Tensor& dst, int64_t dst_row, int64_t dst_col, const Tensor& src, int64_t src_row,
               int64_t src_col, int64_t rows, int64_t cols) {
  constexpr std::string_view op = "add_block";
  const OpDevice on(op, {{"dst", dst}, {"src", src}});
  check::f32(op, "dst", dst);
  if (!check_blocks(op, dst, dst_row, dst_col, src, src_row, src_col, rows, cols)) return;
  if (on.cpu()) return cpu::add_block(dst, dst_row, dst_col, src, src_row, src_col, rows, cols);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::add_block(dst, dst_row, dst_col, src, src_row, src_col, rows, cols);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
