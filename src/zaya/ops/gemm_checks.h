// The GEMM fronts' shape logic, shared with the backends: the dims of C = op(A)·op(B) and the
// device-neutral check of one problem (shapes, dtypes, overlap; no tensor memory is read).
#pragma once

#include <cstdint>
#include <string_view>

#include "zaya/ops/gemm.h"

namespace zaya::ops {

// The dims of one C = op(A)·op(B) problem: A (and C) may carry a batch dim, B a batch of its own
// (batch_b = 1 for a 2-D B shared by every batch entry).
struct GemmDims {
  int64_t batch, batch_b, m, n, k;
};

// Rows and columns of op(X) for a 2-D or 3-D X.
inline void gemm_op_dims(const Tensor& x, Trans t, int64_t& rows, int64_t& cols) {
  const int64_t r = x.size(-2), c = x.size(-1);
  rows = t == Trans::N ? r : c;
  cols = t == Trans::N ? c : r;
}

// The dims of a problem that check_gemm_problem accepted.
inline GemmDims gemm_dims(const Tensor& A, Trans ta, const Tensor& B, Trans tb) {
  GemmDims d;
  d.batch = A.ndim() == 3 ? A.size(0) : 1;
  d.batch_b = B.ndim() == 3 ? B.size(0) : 1;
  int64_t kb;
  gemm_op_dims(A, ta, d.m, d.k);
  gemm_op_dims(B, tb, kb, d.n);
  return d;
}

// Checks one problem's operands as gemm.h states them (errors name the op and the shapes) and
// returns its dims.
GemmDims check_gemm_problem(std::string_view op, const Tensor& A, Trans ta, const Tensor& B, Trans tb,
                            const Tensor& C);

}  // namespace zaya::ops
