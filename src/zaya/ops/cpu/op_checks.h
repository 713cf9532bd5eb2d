// Argument checks shared by every CPU op (dense, GEMM, loss, optimizer, and the sequence ops: CCA,
// RoPE, attention, MoE routing). Every failure is a zaya::Error naming the op, the tensor, what was
// expected and what was found (docs/CONTRIBUTING.md, "The error story").
#pragma once

#include <cstdint>
#include <string_view>

#include "zaya/core/tensor.h"

namespace zaya::ops::detail {

// CUDA tensors reach these ops only by mistake until the CUDA kernels exist.
inline void require_cpu(std::string_view op, std::string_view what, const Tensor& t) {
  ZAYA_CHECK(t.device() == Device::cpu, op, ": no CUDA kernel yet (", what, " is ", t.str(), ")");
}
inline void require_cpu(std::string_view op, const Tensor& t) {
  ZAYA_CHECK(t.device() == Device::cpu, op, ": no CUDA kernel yet (got ", t.str(), ")");
}

// Defined, on the CPU, of dtype `dt`.
inline void require_cpu_dtype(std::string_view op, std::string_view what, const Tensor& t, DType dt) {
  ZAYA_CHECK(t.defined(), op, ": ", what, " is not defined");
  require_cpu(op, what, t);
  ZAYA_CHECK(t.dtype() == dt, op, ": ", what, " must be ", dtype_name(dt), ", found ", t.str());
}
inline void require_f32(std::string_view op, std::string_view what, const Tensor& t) {
  require_cpu_dtype(op, what, t, DType::f32);
}
inline void require_cpu_f32(std::string_view op, std::string_view what, const Tensor& t) {
  require_cpu_dtype(op, what, t, DType::f32);
}
inline void require_cpu_i32(std::string_view op, std::string_view what, const Tensor& t) {
  require_cpu_dtype(op, what, t, DType::i32);
}

inline void require_shape(std::string_view op, std::string_view what, const Tensor& t, const Shape& s) {
  check_shape(str(op, ": ", what), t, s);
}

// A tensor with exactly this shape (weights, tables, caches), f32 on the CPU.
inline void require_exact(std::string_view op, std::string_view what, const Tensor& t, const Shape& s) {
  require_cpu_f32(op, what, t);
  require_shape(op, what, t, s);
}

// An activation of B·T rows of F features may be passed as [B, T, F], [B·T, F] or, for per-head
// data, [B, T, heads, hd] with heads·hd = F: all are the same contiguous bytes.
inline void require_rows(std::string_view op, std::string_view what, const Tensor& t, int64_t B, int64_t T,
                         int64_t F) {
  require_cpu_f32(op, what, t);
  const Shape& s = t.shape();
  bool ok = (s == Shape{B, T, F}) || (s == Shape{B * T, F}) ||
            (s.ndim() == 4 && s[0] == B && s[1] == T && s[2] * s[3] == F);
  if (!ok) require_shape(op, what, t, Shape{B, T, F});
}

// N rows of F features for a per-token op: [N, F], [B, T, F] or [B, T, heads, hd] with the right
// product (the op does not care how the rows are grouped).
inline void require_n_rows(std::string_view op, std::string_view what, const Tensor& t, int64_t N,
                           int64_t F) {
  require_cpu_f32(op, what, t);
  const Shape& s = t.shape();
  bool ok = t.numel() == N * F && s.ndim() >= 2 &&
            (s[s.ndim() - 1] == F || (s.ndim() >= 3 && s[s.ndim() - 1] * s[s.ndim() - 2] == F));
  if (!ok) require_shape(op, what, t, Shape{N, F});
}

inline void require_positive(std::string_view op, std::string_view what, int64_t v) {
  ZAYA_CHECK(v > 0, op, ": ", what, " must be positive, found ", v);
}

}  // namespace zaya::ops::detail

namespace zaya::ops {
// The sequence ops (cca, rope, attention, moe) call these as seq::…; one set of checks, two names.
namespace seq = detail;
}  // namespace zaya::ops
