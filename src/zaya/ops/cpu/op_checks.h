// Argument checks shared by the CPU ops of gemm/dense/loss/optim_ops: every failure is a
// zaya::Error naming the op and the offending tensor (docs/CONTRIBUTING.md, "The error story").
#pragma once

#include <string_view>

#include "zaya/core/tensor.h"

namespace zaya::ops::detail {

// CUDA tensors reach these ops only by mistake until the CUDA kernels exist.
inline void require_cpu(std::string_view op, const Tensor& t) {
  ZAYA_CHECK(t.device() == Device::cpu, op, ": no CUDA kernel yet (got ", t.str(), ")");
}

inline void require_f32(std::string_view op, std::string_view what, const Tensor& t) {
  ZAYA_CHECK(t.defined(), op, ": ", what, " is not defined");
  require_cpu(op, t);
  ZAYA_CHECK(t.dtype() == DType::f32, op, ": ", what, " must be f32, found ", t.str());
}

inline void require_shape(std::string_view op, std::string_view what, const Tensor& t, const Shape& s) {
  check_shape(str(op, ": ", what), t, s);
}

}  // namespace zaya::ops::detail
