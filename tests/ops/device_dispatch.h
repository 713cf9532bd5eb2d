// Checks of the op fronts' device dispatch that run without a GPU.
//
// Tensor::empty on Device::cuda needs a GPU, so these tests label host memory as CUDA memory
// (Tensor::borrow with Device::cuda). An op front only reads a tensor's shape, dtype and device
// before its dispatch, and an op without a CUDA kernel stops there, so the memory behind the label
// is never touched. Once an op has a CUDA kernel, its test runs on real device tensors instead
// (skipped without a GPU; docs/CONTRIBUTING.md, "Adding an op"), and the labelled tensors only check
// that, without a GPU, the kernel's front fails with a clear error before anything is launched.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "test_util.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya::test {

// A tensor over t's memory that claims to be on the CUDA device.
inline Tensor as_cuda(const Tensor& t) { return Tensor::borrow(t.raw(), t.shape(), t.dtype(), Device::cuda); }

// Makes zero-filled tensors labelled CUDA over host buffers that it keeps alive.
class CudaLabelled {
 public:
  Tensor operator()(const Shape& shape, DType dtype = DType::f32) {
    host_.push_back(Tensor::zeros(shape, dtype));
    return as_cuda(host_.back());
  }

 private:
  std::vector<Tensor> host_;
};

// The call must throw "no CUDA kernel for ops::<op> yet (<arg> is <tensor> cuda)".
inline void expect_no_cuda_kernel(std::string_view op, const std::function<void()>& call) {
  const std::string msg = error_of(call);
  EXPECT_NE(msg.find(str("no CUDA kernel for ops::", op, " yet (")), std::string::npos) << op << ": " << msg;
  EXPECT_NE(msg.find(" cuda)"), std::string::npos) << op << ": " << msg;
}

// For an op with a CUDA kernel, called with CUDA tensors where no GPU is present: the call must
// throw "ops::<op>: the CUDA device context needs a GPU, but no GPU is present (...)". A CPU-only
// build compiles the CUDA dispatch out, so there the front stops at "no CUDA kernel for ops::<op>".
inline void expect_needs_gpu(std::string_view op, const std::function<void()>& call) {
  const std::string msg = error_of(call);
  const std::string expected = cuda::built_with_cuda()
                                   ? str("ops::", op, ": the CUDA device context needs a GPU, but no GPU is present (")
                                   : str("no CUDA kernel for ops::", op, " yet (");
  EXPECT_NE(msg.find(expected), std::string::npos) << op << ": " << msg;
}

// The call must throw an error naming the op and `arg`, the argument on another device than the
// call's first tensor.
inline void expect_mixed_devices(std::string_view op, std::string_view arg,
                                 const std::function<void()>& call) {
  const std::string msg = error_of(call);
  EXPECT_NE(msg.find(str(op, ": ", arg, " is ")), std::string::npos) << op << ": " << msg;
  EXPECT_NE(msg.find("must be on the same device"), std::string::npos) << op << ": " << msg;
}

}  // namespace zaya::test
