// What the CPU-versus-CUDA op tests share (test_moe_cuda.cc, test_loss_cuda.cc,
// test_linear_cuda.cc): the skip without a GPU (or without ops::gemm's CUDA kernel, for ops built
// on it), copies to the device and comparisons of a CUDA result with the CPU's.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "ops/gradcheck.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/tensor.h"
#include "zaya/ops/gemm.h"

namespace zaya::test {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason()

// Why ops::gemm cannot run on CUDA tensors in this build ("" when it can): the GEMM kernels are
// another family's, and the ops built on them skip until it has them.
inline std::string gemm_missing_on_cuda() {
  Tensor a = Tensor::zeros({1, 1}, DType::f32).to(Device::cuda),
         c = Tensor::empty({1, 1}, DType::f32, Device::cuda);
  try {
    ops::gemm(c, a, ops::Trans::N, a, ops::Trans::T, 1.0f, 0.0f);
  } catch (const Error& e) {
    if (std::string(e.what()).find("no CUDA kernel for ops::gemm") != std::string::npos) return e.what();
    throw;
  }
  return "";
}

#define SKIP_WITHOUT_GEMM()                                               \
  if (const std::string why = test::gemm_missing_on_cuda(); !why.empty()) \
  GTEST_SKIP() << "this op's products need ops::gemm on CUDA: " << why

inline Tensor on_gpu(const Tensor& host) { return host.to(Device::cuda); }
inline Tensor gpu_empty(const Shape& s, DType d = DType::f32) { return Tensor::empty(s, d, Device::cuda); }

// ||cuda − cpu|| / ||cpu||, the CUDA tensor copied back first.
inline double rel_diff(const Tensor& on_cuda, const Tensor& on_cpu) {
  return rel_error(on_cuda.to(Device::cpu), to_f64(on_cpu));
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu), hb = b.to(Device::cpu);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

}  // namespace zaya::test
