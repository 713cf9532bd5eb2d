// ops::experts_forward / experts_backward against a float64 reference written again here: the
// forward's outputs, and the backward's input and weight gradients against central differences
// of the reference loss L = Σ dy ⊙ y. The CPU's two ways (fused and grouped) and thread counts
// give the same bits; side tasks run exactly once, by the op when it says so and else not at all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gradcheck.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/experts_cpu.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/gemm_many.h"
#include "zaya/ops/moe.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;

constexpr int64_t N = 24, H = 8, I = 4, E = 3;

struct Case {
  Tensor x, choice, counts, offsets, pos, src, w_gu, w_d;
  int64_t M = 0;
};

// Tokens spread over the experts and the skip class (E).
Case make_case(uint64_t seed) {
  Case c;
  c.x = random_tensor({N, H}, seed);
  c.choice = Tensor::empty({N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) c.choice.data<int32_t>()[n] = static_cast<int32_t>((n * 7 + seed) % (E + 1));
  c.counts = Tensor::empty({E}, DType::i32);
  c.offsets = Tensor::empty({E + 1}, DType::i32);
  c.pos = Tensor::empty({N}, DType::i32);
  c.src = Tensor::empty({N}, DType::i32);
  c.M = moe_plan(c.counts, c.offsets, c.pos, c.src, c.choice, N, E);
  c.w_gu = random_tensor({E, 2 * I, H}, seed + 1, 0.4f);
  c.w_d = random_tensor({E, H, I}, seed + 2, 0.4f);
  return c;
}

struct Bufs {
  ExpertActs a;
  ExpertScratch s;
  Tensor dy, dxp, g_gu, g_d;
};

Bufs make_bufs(uint64_t seed) {
  Bufs b;
  b.a = {Tensor::zeros({N, H}, DType::f32), Tensor::zeros({N, 2 * I}, DType::f32), Tensor::zeros({N, I}, DType::f32),
         Tensor::zeros({N, H}, DType::f32), Tensor{}, Tensor{}};
  b.s = {Tensor::zeros({N, I}, DType::f32), Tensor::zeros({N, 2 * I}, DType::f32), Tensor{}, Tensor{}};
  b.dy = random_tensor({N, H}, seed);
  b.dxp = Tensor::zeros({N, H}, DType::f32);
  b.g_gu = Tensor::zeros({E, 2 * I, H}, DType::f32);
  b.g_d = Tensor::zeros({E, H, I}, DType::f32);
  return b;
}

// y (permuted rows < M) of the reference, from xp (double, permuted rows) and the weights.
std::vector<double> reference_y(const std::vector<double>& xp, const std::vector<double>& wgu,
                                const std::vector<double>& wd, const int32_t* off) {
  std::vector<double> y(N * H, 0.0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = off[e]; r < off[e + 1]; ++r) {
      std::vector<double> act(I);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, v = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += xp[r * H + h] * wgu[(e * 2 * I + i) * H + h];
          v += xp[r * H + h] * wgu[(e * 2 * I + I + i) * H + h];
        }
        act[i] = g / (1 + std::exp(-g)) * v;
      }
      for (int64_t h = 0; h < H; ++h) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += act[i] * wd[(e * H + h) * I + i];
        y[r * H + h] = s;
      }
    }
  return y;
}

std::vector<double> gathered(const Case& c) {
  const std::vector<double> x = to_f64(c.x);
  std::vector<double> xp(N * H, 0.0);
  for (int64_t r = 0; r < c.M; ++r)
    for (int64_t h = 0; h < H; ++h) xp[r * H + h] = x[c.src.data<int32_t>()[r] * H + h];
  return xp;
}

int g_side_runs = 0;
void count_side(void*, int64_t) { ++g_side_runs; }

TEST(Experts, ForwardAndBackwardMatchFloat64) {
  const Case c = make_case(3);
  ASSERT_GT(c.M, 0);
  ASSERT_LT(c.M, N) << "the case should skip some tokens";
  Bufs b = make_bufs(9);
  experts_forward(b.a, c.x, c.src, c.offsets, {c.w_gu, c.w_d}, c.M);
  const int32_t* off = c.offsets.data<int32_t>();
  const std::vector<double> xp = gathered(c), wgu = to_f64(c.w_gu), wd = to_f64(c.w_d), dy = to_f64(b.dy);
  const std::vector<double> y_ref = reference_y(xp, wgu, wd, off);
  std::vector<double> y = to_f64(b.a.y), xp_ours = to_f64(b.a.xp);
  y.resize(c.M * H);
  xp_ours.resize(c.M * H);
  EXPECT_EQ(xp_ours, std::vector<double>(xp.begin(), xp.begin() + c.M * H)) << "the gather is a copy";
  // f32 with H, I <= 8: products of a few terms, ~1e-7 relative.
  EXPECT_LT(test::rel_error(y, std::vector<double>(y_ref.begin(), y_ref.begin() + c.M * H)), 1e-5);

  experts_backward(b.dxp, {b.g_gu, b.g_d}, b.dy, c.offsets, {c.w_gu, c.w_d}, b.a, b.s, c.M, {});
  auto loss = [&](const std::vector<double>& xp_, const std::vector<double>& wgu_, const std::vector<double>& wd_) {
    const std::vector<double> yy = reference_y(xp_, wgu_, wd_, off);
    double L = 0;
    for (int64_t i = 0; i < c.M * H; ++i) L += dy[i] * yy[i];
    return L;
  };
  const std::vector<double> dxp_num =
      test::numerical_gradient([&](const std::vector<double>& v) { return loss(v, wgu, wd); }, xp);
  const std::vector<double> dgu_num =
      test::numerical_gradient([&](const std::vector<double>& v) { return loss(xp, v, wd); }, wgu);
  const std::vector<double> dd_num =
      test::numerical_gradient([&](const std::vector<double>& v) { return loss(xp, wgu, v); }, wd);
  std::vector<double> dxp = to_f64(b.dxp);
  dxp.resize(c.M * H);
  // float32 backward against float64 differences: 1e-4 relative is ~1000x f32 rounding and far
  // below any wrong term (a missing SiLU derivative is O(1)).
  EXPECT_LT(test::rel_error(dxp, std::vector<double>(dxp_num.begin(), dxp_num.begin() + c.M * H)), 1e-4);
  EXPECT_LT(test::rel_error(b.g_gu, dgu_num), 1e-4);
  EXPECT_LT(test::rel_error(b.g_d, dd_num), 1e-4);
}

TEST(Experts, FusedGroupedAndThreadCountsGiveTheSameBits) {
  const Case c = make_case(5);
  std::vector<std::vector<float>> outs;
  bool some_ran = false, some_did_not = false;
  for (int threads : {1, 2, 3})
    for (bool fused : {true, false}) {
      set_num_threads(threads);
      cpu::set_fused_experts(fused);
      Bufs b = make_bufs(11);
      experts_forward(b.a, c.x, c.src, c.offsets, {c.w_gu, c.w_d}, c.M);
      g_side_runs = 0;
      SideTask side[2] = {{&count_side, nullptr, 0, 1.0}, {&count_side, nullptr, 1, 2.0}};
      const bool ran = experts_backward(b.dxp, {b.g_gu, b.g_d}, b.dy, c.offsets, {c.w_gu, c.w_d}, b.a, b.s, c.M, side);
      EXPECT_EQ(g_side_runs, ran ? 2 : 0) << "side tasks must run once when the op says it ran them, else never";
      (ran ? some_ran : some_did_not) = true;
      std::vector<float> all;
      for (const Tensor* t : {&b.a.y, &b.dxp, &b.g_gu, &b.g_d})
        all.insert(all.end(), t->data<float>(), t->data<float>() + t->numel());
      outs.push_back(all);
    }
  cpu::set_fused_experts(true);
  set_num_threads(default_num_threads());
  EXPECT_TRUE(some_ran && some_did_not) << "both ways (side tasks inside the op and left to the caller) must be covered";
  for (size_t i = 1; i < outs.size(); ++i)
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * sizeof(float)), 0) << "variant " << i;
}

TEST(Experts, BadArgumentsNameTheOpAndTheArgument) {
  const Case c = make_case(3);
  Bufs b = make_bufs(9);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string m1 = message([&] {
    experts_forward(b.a, c.x, c.src, c.offsets, {c.w_gu, c.w_d.slice(0, 2)}, c.M);
  });
  EXPECT_NE(m1.find("experts_forward"), std::string::npos) << m1;
  EXPECT_NE(m1.find("down"), std::string::npos) << m1;
  ExpertActs short_y = b.a;
  short_y.y = Tensor::zeros({1, H}, DType::f32);
  const std::string m2 = message([&] { experts_forward(short_y, c.x, c.src, c.offsets, {c.w_gu, c.w_d}, c.M); });
  EXPECT_NE(m2.find("y has shape [1, 8]"), std::string::npos) << m2;
  const std::string m3 = message([&] {
    experts_forward(b.a, c.x, c.src, c.offsets, {random_tensor({E, 2 * I, H}, 1, 1.0f, DType::bf16), c.w_d}, c.M);
  });
  EXPECT_NE(m3.find("down"), std::string::npos) << m3;  // bf16 gate_up with f32 down
}

// The experts' fronts (and gemm_many's) handed CUDA tensors (host memory labelled CUDA:
// device_dispatch.h) name the argument on another device; where no GPU is present their CUDA
// kernels (cuda/experts.cu, cuda/gemm.cu) say so naming the op, before anything is launched (with a
// GPU, test_experts_cuda.cc runs them on device memory).
TEST(ExpertsDevice, MixedDevicesNameTheArgumentAndCudaTensorsNeedAGpu) {
  test::CudaLabelled cu;
  Tensor x = cu({N, H}), src = cu({N}, DType::i32), offsets = cu({E + 1}, DType::i32);
  const ExpertWeights w{cu({E, 2 * I, H}), cu({E, H, I})}, g{cu({E, 2 * I, H}), cu({E, H, I})};
  const ExpertActs a{cu({N, H}), cu({N, 2 * I}), cu({N, I}), cu({N, H}), Tensor{}, Tensor{}};
  const ExpertScratch s{cu({N, I}), cu({N, 2 * I}), Tensor{}, Tensor{}};
  Tensor dy = cu({N, H}), dxp = cu({N, H});
  Tensor src_cpu = Tensor::zeros({N}, DType::i32);
  test::expect_mixed_devices("experts_forward", "src", [&] { experts_forward(a, x, src_cpu, offsets, w, 4); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_experts_cuda.cc runs these ops on it";
  test::expect_needs_gpu("experts_forward", [&] { experts_forward(a, x, src, offsets, w, 4); });
  test::expect_needs_gpu("experts_backward", [&] { experts_backward(dxp, g, dy, offsets, w, a, s, 4, {}); });
  const GemmProblem p[1] = {{cu({4, 3}), cu({3, 5}), cu({4, 5})}};
  test::expect_needs_gpu("gemm_many", [&] { gemm_many(p, Trans::N, Trans::N); });
}

}  // namespace
}  // namespace zaya::ops
