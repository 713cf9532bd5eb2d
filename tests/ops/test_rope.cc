// Partial RoPE: table against float64 angles, forward against a float64 rotate-half rotation of
// the same tables, backward as the exact transpose, in-place = out-of-place, offsets for decode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "ops/device_dispatch.h"
#include "gradcheck.h"
#include "zaya/ops/rope.h"

namespace zaya {
namespace {

using test::to_f64;
using V = std::vector<double>;

TEST(Rope, TableMatchesFloat64Angles) {
  const int64_t hd = 64, P = 300;
  ops::RopeTable t = ops::make_rope_table(hd, 0.5, 1e4, P);
  ASSERT_EQ(t.rot, 32);
  for (int64_t p = 0; p < P; p += 7)
    for (int64_t j = 0; j < 16; ++j) {
      double angle = p * std::pow(1e4, -2.0 * j / 32);
      // The reference forms the angle in fp32 (inv_freq rounded, then pos·inv_freq rounded): up to
      // ~2 ulps of the angle, i.e. 2.4e-7·angle, plus the final fp32 rounding of cos/sin.
      double tol = 2.5e-7 * std::max(1.0, angle) + 1e-7;
      EXPECT_NEAR(t.cos.data<float>()[p * 16 + j], std::cos(angle), tol);
      EXPECT_NEAR(t.sin.data<float>()[p * 16 + j], std::sin(angle), tol);
    }
  EXPECT_THROW(ops::make_rope_table(6, 0.5, 1e4, 8), Error);  // rot = 3 is odd
}

V rope_ref(const V& x, const ops::RopeTable& t, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t off, double sign) {
  V y = x;
  const int64_t half = t.rot / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < half; ++j) {
          const int64_t o = ((b * T + i) * H + h) * hd;
          double c = t.cos.data<float>()[(i + off) * half + j], s = sign * t.sin.data<float>()[(i + off) * half + j];
          y[o + j] = x[o + j] * c - x[o + j + half] * s;
          y[o + j + half] = x[o + j + half] * c + x[o + j] * s;
        }
  return y;
}

TEST(Rope, ForwardBackwardInPlaceAndOffsets) {
  for (auto [B, T, H, hd] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 4, 16}, {2, 5, 2, 32},
                             {3, 67, 1, 64}}) {
    ops::RopeTable t = ops::make_rope_table(hd, 0.5, 5e6, T + 3);
    Tensor x = test::random_tensor(Shape{B, T, H, hd}, 1), y = x.clone();
    ops::rope_forward(y, x, t, B, T, H, hd, 3);
    EXPECT_LT(test::rel_error(y, rope_ref(to_f64(x), t, B, T, H, hd, 3, 1.0)), 1e-7);  // two fp32 products + add
    // Pass-through dims are copied exactly.
    for (int64_t d = t.rot; d < hd; ++d) EXPECT_EQ(y.data<float>()[d], x.data<float>()[d]);
    // In place gives the same bits.
    Tensor z = x.clone();
    ops::rope_forward(z, z, t, B, T, H, hd, 3);
    EXPECT_EQ(std::memcmp(z.raw(), y.raw(), y.nbytes()), 0);
    // Backward is the transpose of the (linear) forward: ⟨g, R x⟩ = ⟨Rᵀ g, x⟩.
    Tensor g = test::random_tensor(x.shape(), 2), dx = g.clone();
    ops::rope_backward(dx, g, t, B, T, H, hd, 3);
    double lhs = test::dot(to_f64(g), rope_ref(to_f64(x), t, B, T, H, hd, 3, 1.0));
    double rhs = test::dot(to_f64(dx), to_f64(x));
    EXPECT_NEAR(lhs, rhs, 1e-6 * (std::fabs(lhs) + 1));  // fp32 rounding of dx
    // Decode: one token at offset p equals row p of the full-sequence forward.
    if (T > 2) {
      Tensor full = x.clone();
      ops::rope_forward(full, x, t, B, T, H, hd, 0);
      Tensor one = Tensor::empty(Shape{1, 1, H, hd}, DType::f32);
      std::memcpy(one.raw(), x.data<float>() + 2 * H * hd, H * hd * 4);
      ops::rope_forward(one, one, t, 1, 1, H, hd, 2);
      EXPECT_EQ(std::memcmp(one.raw(), full.data<float>() + 2 * H * hd, H * hd * 4), 0);
    }
  }
}

TEST(Rope, RejectsPositionsBeyondTheTable) {
  ops::RopeTable t = ops::make_rope_table(16, 0.5, 1e4, 4);
  Tensor x = test::random_tensor(Shape{1, 3, 2, 16}, 1);
  EXPECT_THROW(ops::rope_forward(x, x, t, 1, 3, 2, 16, 2), Error);
  EXPECT_NO_THROW(ops::rope_forward(x, x, t, 1, 3, 2, 16, 1));
}

// With a CUDA kernel (cuda/rope.cu), CUDA tensors where no GPU is present give a zaya::Error naming
// the op before any kernel runs (host memory under a CUDA label: skipped with a GPU, where
// test_rope_cuda.cc runs the ops on device memory); a table on another device is named.
TEST(RopeDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  const int64_t B = 1, T = 3, heads = 2, hd = 4;
  ops::RopeTable cpu_table = ops::make_rope_table(hd, 0.5, 1e4, 8), table = cpu_table;
  table.cos = test::as_cuda(cpu_table.cos);
  table.sin = test::as_cuda(cpu_table.sin);
  Tensor x = cu({B, T, heads, hd}), y = cu({B, T, heads, hd});
  test::expect_mixed_devices("rope_forward", "cos table",
                             [&] { ops::rope_forward(y, x, cpu_table, B, T, heads, hd); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_rope_cuda.cc runs these ops on it";
  test::expect_needs_gpu("rope_forward", [&] { ops::rope_forward(y, x, table, B, T, heads, hd); });
  test::expect_needs_gpu("rope_backward", [&] { ops::rope_backward(x, y, table, B, T, heads, hd); });
}

}  // namespace
}  // namespace zaya
