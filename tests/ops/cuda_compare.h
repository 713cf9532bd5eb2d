// What the CPU-versus-CUDA op tests share (test_rope_cuda.cc, test_cca_cuda.cc,
// test_attention_cuda.cc): the skip without a GPU, copies to the device, and the comparisons.
// Errors are norm-wise relative, ||cuda − cpu|| / ||cpu||, the CUDA result copied back first.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>

#include "ops/gradcheck.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya::test {

#define ZAYA_SKIP_WITHOUT_GPU() \
  if (::zaya::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << ::zaya::cuda::no_device_reason()

inline Tensor on_gpu(const Tensor& host) { return host.to(Device::cuda); }
inline Tensor gpu_empty(const Shape& shape) { return Tensor::empty(shape, DType::f32, Device::cuda); }

inline double rel_diff(const Tensor& on_cuda, const Tensor& on_cpu) {
  return rel_error(on_cuda.to(Device::cpu), to_f64(on_cpu));
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu), hb = b.to(Device::cpu);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

}  // namespace zaya::test
