#include <gtest/gtest.h>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya {
namespace {

TEST(CudaRuntime, RoundTripStreamsAndEvents) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  auto devs = cuda::devices();
  ASSERT_FALSE(devs.empty());
  EXPECT_GT(devs[0].total_memory, 0u);
  Tensor h = Tensor::empty({1000}, DType::f32);
  for (int i = 0; i < 1000; ++i) h.data<float>()[i] = 0.5f * static_cast<float>(i);
  Tensor d = h.to(Device::cuda);
  Tensor d2 = d.clone();
  Tensor back = d2.to(Device::cpu);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(back.data<float>()[i], h.data<float>()[i]);
  cuda::Stream s;
  cuda::Event a, b;
  a.record(s);
  b.record(s);
  b.synchronize();
  EXPECT_GE(cuda::Event::elapsed_ms(a, b), 0.0f);
}

}  // namespace
}  // namespace zaya
