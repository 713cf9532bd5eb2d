// The per-thread CUDA device context (core/cuda_context.h), CUDA tensors and the arena on the
// device. Without a GPU: the errors a user gets. With one: the context's stream, cuBLASLt handle,
// scratch and copies, and the arena's single allocation.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "zaya/core/arena.h"
#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason()

// "... needs a GPU, but no GPU is present (<driver's reason>)" in a CUDA build, "... but this zaya
// was built without CUDA (...)" in a CPU-only one.
std::string why_no_gpu() {
  return cuda::built_with_cuda() ? "needs a GPU, but no GPU is present (" : "needs a GPU, but this zaya was built without CUDA";
}

TEST(CudaContext, WithoutAGpuCudaTensorsArenasAndTheContextNameWhatWasAsked) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: the errors below cannot happen";
  const std::string tensor = test::error_of([] { Tensor::empty({4, 8}, DType::f32, Device::cuda); });
  EXPECT_EQ(tensor.rfind("a CUDA tensor f32[4, 8] " + why_no_gpu(), 0), 0u) << tensor;
  const std::string zeros = test::error_of([] { Tensor::zeros({3}, DType::bf16, Device::cuda); });
  EXPECT_EQ(zeros.rfind("a CUDA tensor bf16[3] " + why_no_gpu(), 0), 0u) << zeros;
  const std::string to = test::error_of([] { Tensor::zeros({2, 2}, DType::f32).to(Device::cuda); });
  EXPECT_EQ(to.rfind("a CUDA tensor f32[2, 2] " + why_no_gpu(), 0), 0u) << to;
  const std::string arena = test::error_of([] { Arena a(1 << 20, Device::cuda); });
  EXPECT_EQ(arena.rfind("a CUDA arena of 1048576 bytes " + why_no_gpu(), 0), 0u) << arena;
  const std::string context = test::error_of([] { cuda::current(); });
  EXPECT_EQ(context.rfind("the CUDA device context " + why_no_gpu(), 0), 0u) << context;
}

TEST(CudaContext, OnePerThreadWithAStreamALazyCublasLtHandleAndScratch) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceContext& ctx = cuda::current();
  EXPECT_EQ(&ctx, &cuda::current());  // the same context on every call from this thread
  EXPECT_NE(ctx.stream(), nullptr);
  const void* handle = ctx.cublaslt();
  EXPECT_NE(handle, nullptr);
  EXPECT_EQ(ctx.cublaslt(), handle);
  EXPECT_NE(ctx.cublaslt_workspace(), nullptr);
  void* small = ctx.scratch(1024);
  EXPECT_EQ(ctx.scratch(512), small);  // grows only: a smaller request reuses the buffer
  EXPECT_NE(ctx.scratch(size_t{64} << 20), nullptr);
  const cuda::DeviceContext* other = nullptr;
  std::thread([&] { other = &cuda::current(); }).join();
  EXPECT_NE(other, &ctx);  // another thread has its own context (and stream)
}

TEST(CudaContext, CopiesOnTheStreamRoundTrip) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceContext& ctx = cuda::current();
  std::vector<float> host(4099), back(4099, -1.0f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i);
  Tensor dev = Tensor::empty({4099}, DType::f32, Device::cuda);
  ctx.copy_async(dev.raw(), Device::cuda, host.data(), Device::cpu, host.size() * sizeof(float));
  Tensor dev2 = Tensor::empty({4099}, DType::f32, Device::cuda);
  ctx.copy_async(dev2.raw(), Device::cuda, dev.raw(), Device::cuda, host.size() * sizeof(float));
  ctx.copy_async(back.data(), Device::cpu, dev2.raw(), Device::cuda, host.size() * sizeof(float));
  ctx.synchronize();
  EXPECT_EQ(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)), 0);
}

TEST(CudaContext, TheArenaOnTheDeviceIsOneAllocationHandedOutInViews) {
  SKIP_WITHOUT_GPU();
  Arena arena(size_t{1} << 20, Device::cuda);
  Tensor a = arena.alloc({100}, DType::f32);
  Tensor b = arena.alloc_zeros({7, 9}, DType::bf16);
  Tensor c = arena.alloc({33}, DType::i32);
  // Views of the arena's one device buffer, 64-byte aligned, in order: nothing allocated per alloc.
  EXPECT_TRUE(a.shares_storage_with(b) && b.shares_storage_with(c));
  EXPECT_EQ(a.device(), Device::cuda);
  const auto base = reinterpret_cast<uintptr_t>(a.storage()->ptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw()), base);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) - base, 448u);  // 400 bytes rounded up to 64
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.raw()) - base, 576u);  // 448 + 126 bytes, rounded up
  // The memory works: zeros read back as zeros, a copy round-trips.
  Tensor zeros = b.to(Device::cpu);
  for (int64_t i = 0; i < zeros.numel(); ++i) EXPECT_EQ(zeros.data<bf16>()[i].bits, 0);
  Tensor h = Tensor::empty({100}, DType::f32);
  for (int i = 0; i < 100; ++i) h.data<float>()[i] = static_cast<float>(i);
  a.copy_from(h);
  Tensor back = a.to(Device::cpu);
  EXPECT_EQ(std::memcmp(back.raw(), h.raw(), h.nbytes()), 0);
  arena.reset();
  EXPECT_EQ(arena.alloc({1}, DType::f32).raw(), a.raw());  // rewound: the same memory again
}

}  // namespace
}  // namespace zaya
