// MoE routing and permutation: the biased choice (β changing it, ties, the skip class), the stable
// expert-contiguous plan, and gradients of the whole route → gather → unpermute chain against float64
// central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/device_dispatch.h"
#include "gradcheck.h"
#include "zaya/ops/moe.h"

namespace zaya {
namespace {

using test::rel_error;
using test::to_f64;
using V = std::vector<double>;

Tensor f32(const std::vector<float>& x, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::memcpy(t.raw(), x.data(), x.size() * 4);
  return t;
}

struct Routed {
  Tensor probs, choice, weight;
};
Routed route(const Tensor& logits, const Tensor& beta, int64_t N, int64_t E) {
  Routed r{Tensor::empty(Shape{N, E + 1}, DType::f32), Tensor::empty(Shape{N}, DType::i32),
           Tensor::empty(Shape{N}, DType::f32)};
  ops::moe_route(r.probs, r.choice, r.weight, logits, beta, N, E);
  return r;
}

TEST(MoeRoute, BiasTiesAndSkip) {
  const int64_t E = 3, N = 4;
  // Row 0: expert 1 most likely; β[2] = +0.5 moves the choice to expert 2 (weight stays p_2).
  // Row 1: all logits equal: β[2] decides (here) and, with β = 0 on 0..2 below, the tie → index 0.
  // Row 2: skip class most likely and β[E] = 0 → skip: weight 0.
  // Row 3: like row 2 but the skip logit is only slightly larger: β_skip = −1 (the reference's init
  //        value) hands the token to the best real expert.
  std::vector<float> logits = {0, 2, 1, 0, 1, 1, 1, 1, 0, 0, 0, 5, 0, 2, 0, 2.5f};
  Tensor L = f32(logits, Shape{N, E + 1});
  Routed r = route(L, f32({0, 0, 0.5f, 0}, Shape{E + 1}), N, E);
  const int32_t* c = r.choice.data<int32_t>();
  EXPECT_EQ(c[0], 2);
  EXPECT_EQ(c[1], 2);
  EXPECT_EQ(c[2], E);
  EXPECT_EQ(r.weight.data<float>()[2], 0.0f);
  EXPECT_EQ(c[3], E);
  // Unbiased weight: p_2 of row 0 from the softmax in double, fp32 rounding.
  double s = std::exp(0.0) + std::exp(2.0) + std::exp(1.0) + std::exp(0.0);
  EXPECT_NEAR(r.weight.data<float>()[0], std::exp(1.0) / s, 1e-7);
  Routed r2 = route(L, f32({0, 0, 0, -1}, Shape{E + 1}), N, E);
  EXPECT_EQ(r2.choice.data<int32_t>()[3], 1);
  EXPECT_EQ(r2.choice.data<int32_t>()[0], 1);
  EXPECT_EQ(r2.choice.data<int32_t>()[1], 0);  // tie among 0, 1, 2 (skip is −1 behind)
}

TEST(MoePlan, StableExpertContiguousOrder) {
  const int64_t E = 3, N = 8;
  Tensor choice = Tensor::empty(Shape{N}, DType::i32);
  const int32_t ch[] = {2, 0, 3, 2, 0, 1, 3, 0};  // 3 = skip
  std::memcpy(choice.raw(), ch, sizeof ch);
  Tensor counts = Tensor::empty(Shape{E}, DType::i32), offsets = Tensor::empty(Shape{E + 1}, DType::i32),
         pos = Tensor::empty(Shape{N}, DType::i32), src = Tensor::empty(Shape{N}, DType::i32);
  int64_t M = ops::moe_plan(counts, offsets, pos, src, choice, N, E);
  EXPECT_EQ(M, 6);
  EXPECT_EQ(std::vector<int32_t>(counts.data<int32_t>(), counts.data<int32_t>() + E), (std::vector<int32_t>{3, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(offsets.data<int32_t>(), offsets.data<int32_t>() + E + 1),
            (std::vector<int32_t>{0, 3, 4, 6}));
  EXPECT_EQ(std::vector<int32_t>(src.data<int32_t>(), src.data<int32_t>() + M), (std::vector<int32_t>{1, 4, 7, 5, 0, 3}));
  EXPECT_EQ(std::vector<int32_t>(pos.data<int32_t>(), pos.data<int32_t>() + N),
            (std::vector<int32_t>{4, 0, -1, 5, 1, 3, -1, 2}));
  const int32_t bad[] = {4};
  Tensor bc = Tensor::empty(Shape{1}, DType::i32);
  std::memcpy(bc.raw(), bad, 4);
  Tensor c1 = Tensor::empty(Shape{E}, DType::i32), o1 = Tensor::empty(Shape{E + 1}, DType::i32),
         p1 = Tensor::empty(Shape{1}, DType::i32), s1 = Tensor::empty(Shape{1}, DType::i32);
  EXPECT_THROW(ops::moe_plan(c1, o1, p1, s1, bc, 1, E), Error);
}

// The full chain in double with the choices held fixed: out[n] = p_c(logits_n)·y[pos[n]], plus
// ⟨xp, gx⟩ for the gather so dx is checked as well.
TEST(Moe, ChainGradientsMatchFiniteDifferences) {
  const int64_t E = 4, N = 37, H = 24;
  Tensor logits = test::random_tensor(Shape{N, E + 1}, 1, 2.0f), beta = test::random_tensor(Shape{E + 1}, 2, 0.1f);
  Routed r = route(logits, beta, N, E);
  Tensor counts = Tensor::empty(Shape{E}, DType::i32), offsets = Tensor::empty(Shape{E + 1}, DType::i32),
         pos = Tensor::empty(Shape{N}, DType::i32), src = Tensor::empty(Shape{N}, DType::i32);
  const int64_t M = ops::moe_plan(counts, offsets, pos, src, r.choice, N, E);
  ASSERT_GT(M, 0);
  ASSERT_LT(M, N);  // these seeds route some tokens to the skip class
  Tensor x = test::random_tensor(Shape{N, H}, 3), xp = Tensor::empty(Shape{N, H}, DType::f32);
  ops::moe_gather(xp, x, src, M, N, H);
  for (int64_t rr = 0; rr < M; ++rr)
    EXPECT_EQ(std::memcmp(xp.data<float>() + rr * H, x.data<float>() + src.data<int32_t>()[rr] * H, H * 4), 0);
  Tensor y = test::random_tensor(Shape{N, H}, 4), out = Tensor::empty(Shape{N, H}, DType::f32);
  ops::moe_unpermute(out, y, r.weight, pos, M, N, H);
  // Backward chain.
  Tensor g = test::random_tensor(Shape{N, H}, 5), dy = Tensor::zeros(Shape{N, H}, DType::f32);
  Tensor dw = Tensor::empty(Shape{N}, DType::f32), dlogits = Tensor::empty(Shape{N, E + 1}, DType::f32);
  ops::moe_unpermute_backward(dy, dw, g, y, r.weight, pos, M, N, H);
  ops::moe_route_backward(dlogits, dw, r.probs, r.choice, N, E);
  Tensor gx = test::random_tensor(Shape{N, H}, 6), dx = Tensor::empty(Shape{N, H}, DType::f32);
  ops::moe_gather_backward(dx, gx, pos, M, N, H);

  const int32_t* ch = r.choice.data<int32_t>();
  const int32_t* ps = pos.data<int32_t>();
  V g64 = to_f64(g), gx64 = to_f64(gx);
  auto loss = [&](const V& lg, const V& yy, const V& xx) {
    double L = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (ch[n] == E) continue;
      double mx = -INFINITY, s = 0;
      for (int64_t e = 0; e <= E; ++e) mx = std::max(mx, lg[n * (E + 1) + e]);
      for (int64_t e = 0; e <= E; ++e) s += std::exp(lg[n * (E + 1) + e] - mx);
      double p = std::exp(lg[n * (E + 1) + ch[n]] - mx) / s;
      for (int64_t h = 0; h < H; ++h) L += g64[n * H + h] * p * yy[ps[n] * H + h];
      // gather: xp[pos[n]] = x[n], paired with the cotangent row gx[pos[n]]
      for (int64_t h = 0; h < H; ++h) L += gx64[ps[n] * H + h] * xx[n * H + h];
    }
    return L;
  };
  V lg = to_f64(logits), y64 = to_f64(y), x64 = to_f64(x);
  // Smooth in logits (choices fixed); linear in y and x. fp32 backward: ~1e-6 relative.
  EXPECT_LT(rel_error(dlogits, test::numerical_gradient([&](const V& v) { return loss(v, y64, x64); }, lg)), 1e-5);
  V dy64 = to_f64(dy);
  dy64.resize(N * H);
  V ny = test::numerical_gradient([&](const V& v) { return loss(lg, v, x64); }, y64);
  EXPECT_LT(rel_error(V(dy64.begin(), dy64.begin() + M * H), V(ny.begin(), ny.begin() + M * H)), 1e-6);
  EXPECT_LT(rel_error(dx, test::numerical_gradient([&](const V& v) { return loss(lg, y64, v); }, x64)), 1e-7);
  // Skipped tokens: zero output rows, zero router gradient rows.
  for (int64_t n = 0; n < N; ++n)
    if (ch[n] == E) {
      for (int64_t h = 0; h < H; ++h) EXPECT_EQ(out.data<float>()[n * H + h], 0.0f);
      for (int64_t e = 0; e <= E; ++e) EXPECT_EQ(dlogits.data<float>()[n * (E + 1) + e], 0.0f);
    }
}

// The MoE fronts handed CUDA tensors (host memory labelled CUDA: device_dispatch.h) check them as on
// the CPU and, without a GPU, stop at the device context naming the op (moe_plan before it would
// read the choices); mixed devices name the argument. With a GPU, test_moe_cuda.cc runs the kernels.
TEST(MoeDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  const int64_t N = 4, E = 2, H = 3;
  Tensor probs = cu({N, E + 1}), logits = cu({N, E + 1}), beta = cu({E + 1}), weight = cu({N});
  Tensor choice = cu({N}, DType::i32), dlogits = cu({N, E + 1}), dweight = cu({N});
  Tensor counts = cu({E}, DType::i32), offsets = cu({E + 1}, DType::i32), pos = cu({N}, DType::i32);
  Tensor src = cu({N}, DType::i32), x = cu({N, H}), xp = cu({N, H}), dx = cu({N, H}), y = cu({N, H});
  Tensor pos_cpu = Tensor::zeros({N}, DType::i32);
  test::expect_mixed_devices("moe_unpermute", "pos", [&] { ops::moe_unpermute(dx, y, weight, pos_cpu, N, N, H); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_moe_cuda.cc runs these ops on it";
  using test::expect_needs_gpu;
  expect_needs_gpu("moe_route", [&] { ops::moe_route(probs, choice, weight, logits, beta, N, E); });
  expect_needs_gpu("moe_route_backward", [&] { ops::moe_route_backward(dlogits, dweight, probs, choice, N, E); });
  expect_needs_gpu("moe_plan", [&] { ops::moe_plan(counts, offsets, pos, src, choice, N, E); });
  expect_needs_gpu("moe_gather", [&] { ops::moe_gather(xp, x, src, N, N, H); });
  expect_needs_gpu("moe_gather_rows", [&] { ops::moe_gather_rows(xp, x, src, 1, 3, N, H); });
  expect_needs_gpu("moe_gather_backward", [&] { ops::moe_gather_backward(dx, xp, pos, N, N, H); });
  expect_needs_gpu("moe_unpermute", [&] { ops::moe_unpermute(dx, y, weight, pos, N, N, H); });
  expect_needs_gpu("moe_unpermute_backward",
                   [&] { ops::moe_unpermute_backward(y, dweight, dx, xp, weight, pos, N, N, H); });
}

}  // namespace
}  // namespace zaya
