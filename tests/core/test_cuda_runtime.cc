#include <gtest/gtest.h>

#include <vector>

#if defined(ZAYA_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

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

// memset_device and copy must be done when they return, not only queued on the default stream:
// work on a non-blocking stream (the communicators') is not ordered after them. Here a copy on a
// non-blocking stream reads what memset_device and copy wrote just before: 256 MiB, so that
// queued-but-unfinished work (~0.1 ms of HBM time) would show as wrong bytes.
TEST(CudaRuntime, MemsetAndCopyAreCompleteOnReturn) {
#if defined(ZAYA_HAVE_CUDA)
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  const size_t bytes = size_t{256} << 20;
  void* a = cuda::malloc_device(bytes);
  void* b = cuda::malloc_device(bytes);
  cuda::Stream s;
  auto stream = static_cast<cudaStream_t>(s.handle());
  std::vector<unsigned char> host(bytes);
  auto expect_all = [&](unsigned char v, const char* what) {
    size_t wrong = 0;
    for (unsigned char x : host) wrong += x != v;
    EXPECT_EQ(wrong, 0u) << what;
  };
  for (int round = 0; round < 3; ++round) {
    const auto v = static_cast<unsigned char>(0x11 * (round + 1));
    cuda::memset_device(a, v, bytes);
    ASSERT_EQ(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    s.synchronize();
    cuda::copy(host.data(), Device::cpu, b, Device::cuda, bytes);
    expect_all(v, "after memset_device");

    std::fill(host.begin(), host.end(), static_cast<unsigned char>(v + 1));
    cuda::copy(a, Device::cuda, host.data(), Device::cpu, bytes);  // pageable host to device
    ASSERT_EQ(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    s.synchronize();
    std::fill(host.begin(), host.end(), 0);
    cuda::copy(host.data(), Device::cpu, b, Device::cuda, bytes);
    expect_all(static_cast<unsigned char>(v + 1), "after a host-to-device copy");

    cuda::memset_device(b, 0, bytes);
    cuda::copy(b, Device::cuda, a, Device::cuda, bytes);  // device to device
    ASSERT_EQ(cudaMemcpyAsync(a, b, bytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    s.synchronize();
    cuda::copy(host.data(), Device::cpu, a, Device::cuda, bytes);
    expect_all(static_cast<unsigned char>(v + 1), "after a device-to-device copy");
  }
  cuda::free_device(a);
  cuda::free_device(b);
#else
  GTEST_SKIP() << "this build has no CUDA";
#endif
}

}  // namespace
}  // namespace zaya
