#include <gtest/gtest.h>

#include "zaya/core/arena.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

#include <cstring>

namespace zaya {
namespace {

TEST(Shape, NumelAndString) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);  // a 0-d tensor holds one element
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6}), Error);
  EXPECT_THROW((Shape{2, -2}), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32), Error);  // -1 only means "infer" in reshape
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::empty({4, 6}, DType::f32);
  float* p = t.data<float>();
  for (int i = 0; i < 24; ++i) p[i] = static_cast<float>(i);

  Tensor r = t.reshape({2, -1, 3});
  EXPECT_EQ(r.shape(), (Shape{2, 4, 3}));
  EXPECT_TRUE(r.shares_storage_with(t));

  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(rows.data<float>()[0], 6.0f);
  rows.data<float>()[0] = -1.0f;  // writes through to the parent
  EXPECT_EQ(p[6], -1.0f);

  Tensor row = t.select(3);
  EXPECT_EQ(row.shape(), (Shape{6}));
  EXPECT_EQ(row.data<float>()[5], 23.0f);

  Tensor w = t.window(10, {2, 2});
  EXPECT_EQ(w.data<float>()[3], 13.0f);
  EXPECT_TRUE(w.shares_storage_with(t));

  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
  c.data<float>()[0] = 100.0f;
  EXPECT_EQ(p[0], 0.0f);
}

TEST(Tensor, ErrorsNameShapes) {
  Tensor t = Tensor::zeros({2, 3}, DType::f32);
  try {
    check_shape("rmsnorm input", t, {2, 4});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 4]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rmsnorm input"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.slice(1, 3), Error);
  EXPECT_THROW(t.window(5, {2}), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  Tensor i = Tensor::zeros({3}, DType::i32);
  EXPECT_THROW(t.copy_from(i), Error);
}

TEST(Tensor, DtypesAndFill) {
  for (DType d : {DType::f32, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor t = Tensor::empty({3, 5}, d);
    t.fill_(2);
    Tensor u = Tensor::zeros({15}, d);
    u.copy_from(t);
    EXPECT_EQ(u.nbytes(), 15 * dtype_size(d));
    EXPECT_EQ(std::memcmp(u.raw(), t.raw(), u.nbytes()), 0);
  }
  Tensor b = Tensor::empty({2}, DType::bf16);
  b.fill_(1.5);
  EXPECT_EQ(to_float(b.data<bf16>()[1]), 1.5f);
}

TEST(Tensor, CpuAllocationsAreAligned) {
  for (int n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::empty({n}, DType::f32);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  }
}

TEST(Arena, AlignsRewindsAndReportsExhaustion) {
  Arena a(1024);
  Tensor x = a.alloc({3}, DType::f32);  // 12 bytes
  Tensor y = a.alloc({5}, DType::bf16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(y.raw()) % kArenaAlign, 0u);
  EXPECT_EQ(static_cast<char*>(y.raw()) - static_cast<char*>(x.raw()), 64);
  size_t m = a.mark();
  a.alloc({100}, DType::f32);
  EXPECT_EQ(a.peak(), 64 + 64 + 400u);
  a.rewind(m);
  EXPECT_EQ(a.used(), 64 + 10u);
  try {
    a.alloc({1000}, DType::f32);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arena exhausted"), std::string::npos) << e.what();
  }
  a.reset();
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.peak(), 528u);  // peak survives resets: it sizes the next arena
}

TEST(Tensor, CudaTensorsNeedADevice) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; covered by CudaRuntime tests";
  EXPECT_THROW(Tensor::empty({4}, DType::f32, Device::cuda), Error);  // messages: test_cuda_context.cc
}

}  // namespace
}  // namespace zaya
