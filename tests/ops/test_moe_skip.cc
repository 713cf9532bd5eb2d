// The skip-class passthrough (ops/moe_skip.h): forward against a float64 reference, the gradients
// into the input and into the router's weights against float64 central finite differences of a
// small router + skip block, untouched rows of routed tokens, argument errors and the device
// dispatch. CPU against CUDA: test_moe_skip_cuda.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gradcheck.h"
#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/ops/moe.h"
#include "zaya/ops/moe_skip.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

// A router block in float64: logits z = x·Wᵀ [N, K] (W [K, H]), p = softmax(z), choice =
// argmax_e (p_e + β_e) (lowest index on a tie), and the skip passthrough out[n] = p_skip·x[n] for
// tokens whose choice is the skip class E (other rows 0: this block has no experts).
struct RouterSkipRef {
  int64_t N, H, E;
  std::vector<double> beta;

  int64_t K() const { return E + 1; }
  void probs(const std::vector<double>& x, const std::vector<double>& W, std::vector<double>& p) const {
    p.assign(static_cast<size_t>(N * K()), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      double mx = -1e300;
      for (int64_t e = 0; e < K(); ++e) {
        double z = 0;
        for (int64_t h = 0; h < H; ++h) z += x[n * H + h] * W[e * H + h];
        p[n * K() + e] = z;
        mx = std::max(mx, z);
      }
      double sum = 0;
      for (int64_t e = 0; e < K(); ++e) sum += p[n * K() + e] = std::exp(p[n * K() + e] - mx);
      for (int64_t e = 0; e < K(); ++e) p[n * K() + e] /= sum;
    }
  }
  std::vector<int64_t> choice(const std::vector<double>& p) const {
    std::vector<int64_t> c(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      int64_t best = 0;
      for (int64_t e = 1; e < K(); ++e)
        if (p[n * K() + e] + beta[e] > p[n * K() + best] + beta[best]) best = e;
      c[n] = best;
    }
    return c;
  }
  // Σ g ⊙ out with the choices held at `fixed` (a finite difference must not change a decision).
  double loss(const std::vector<double>& x, const std::vector<double>& W, const std::vector<double>& g,
              const std::vector<int64_t>& fixed) const {
    std::vector<double> p;
    probs(x, W, p);
    EXPECT_EQ(choice(p), fixed) << "a finite-difference step changed a routing decision";
    double L = 0;
    for (int64_t n = 0; n < N; ++n)
      if (fixed[n] == E)
        for (int64_t h = 0; h < H; ++h) L += g[n * H + h] * p[n * K() + E] * x[n * H + h];
    return L;
  }
};

TEST(MoeSkip, ForwardIsPSkipTimesTheInputOnSkippedRowsOnly) {
  const int64_t N = 9, E = 3, H = 7, K = E + 1;
  Tensor x = random_tensor({N, H}, 1), probs = random_tensor({N, K}, 2);
  Tensor choice = Tensor::empty({N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>(n % K);  // rows 3, 7 skip
  Tensor out = Tensor::empty({N, H}, DType::f32);
  for (int64_t i = 0; i < N * H; ++i) out.data<float>()[i] = 123.0f;  // routed rows must keep this
  moe_skip_forward(out, x, probs, choice, N, E, H);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const float want = n % K == E ? probs.data<float>()[n * K + E] * x.data<float>()[n * H + h] : 123.0f;
      EXPECT_EQ(out.data<float>()[n * H + h], want) << n << "," << h;  // one product: exact
    }
}

// L = Σ g ⊙ out of the router + skip block. The analytic gradients come from the f32 ops
// (moe_route, then the two skip backwards), with the router's linear layer chained in double in
// the test: dW = dzᵀ·x, dx = dx_pass + dz·W. The finite differences are of the float64 reference
// with eps 1e-6 (truncation and rounding ~1e-9 relative). The ops compute in f32: each gradient
// element is a few roundings of O(1) values plus an H-term dot product, ~1e-7 relative, so
// 1e-5 norm-wise relative leaves a 100x margin and still catches any wrong term (a missing
// δ_Ee, the biased instead of the unbiased probability, p_skip left out of dx: all O(1)).
TEST(MoeSkip, GradientsIntoInputAndRouterWeightsMatchFiniteDifferences) {
  const int64_t N = 12, E = 3, H = 6, K = E + 1;
  Tensor x = random_tensor({N, H}, 11), W = random_tensor({K, H}, 12, 0.8f), g = random_tensor({N, H}, 13);
  Tensor beta = Tensor::empty({K}, DType::f32);
  const float b[] = {0.05f, -0.1f, 0.0f, 0.15f};  // the skip class competes, but does not always win
  for (int64_t e = 0; e < K; ++e) beta.data<float>()[e] = b[e];
  RouterSkipRef ref{N, H, E, std::vector<double>(b, b + K)};
  const std::vector<double> xd = test::to_f64(x), Wd = test::to_f64(W), gd = test::to_f64(g);

  // Forward in f32 through the ops: logits, route, skip.
  Tensor logits = Tensor::empty({N, K}, DType::f32), probs = Tensor::empty({N, K}, DType::f32), choice = Tensor::empty({N}, DType::i32);
  Tensor weight = Tensor::empty({N}, DType::f32);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < K; ++e) {
      double z = 0;
      for (int64_t h = 0; h < H; ++h) z += xd[n * H + h] * Wd[e * H + h];
      logits.data<float>()[n * K + e] = static_cast<float>(z);
    }
  moe_route(probs, choice, weight, logits, beta, N, E);
  std::vector<double> pref;
  ref.probs(xd, Wd, pref);
  const std::vector<int64_t> fixed = ref.choice(pref);
  int skipped = 0;
  for (int64_t n = 0; n < N; ++n) {
    ASSERT_EQ(choice.data<int32_t>()[n], fixed[n]) << "f32 and float64 routing disagree at token " << n;
    skipped += fixed[n] == E;
  }
  ASSERT_GE(skipped, 3) << "the skip class must win for several tokens";
  ASSERT_LE(skipped, N - 3) << "and lose for several";

  Tensor out = Tensor::zeros({N, H}, DType::f32);
  moe_skip_forward(out, x, probs, choice, N, E, H);
  std::vector<double> out_ref(static_cast<size_t>(N * H), 0.0);
  for (int64_t n = 0; n < N; ++n)
    if (fixed[n] == E)
      for (int64_t h = 0; h < H; ++h) out_ref[n * H + h] = pref[n * K + E] * xd[n * H + h];
  EXPECT_LT(test::rel_error(out, out_ref), 1e-6);

  // Backward: the routed rows' dlogits are the native moe_route_backward's (0 here: no experts
  // means no weight gradient), the skipped rows' the skip op's.
  Tensor dweight = Tensor::zeros({N}, DType::f32), dlogits = Tensor::empty({N, K}, DType::f32), dx = Tensor::zeros({N, H}, DType::f32);
  moe_route_backward(dlogits, dweight, probs, choice, N, E);
  moe_skip_router_backward(dlogits, g, x, probs, choice, N, E, H);
  moe_skip_input_backward(dx, g, probs, choice, N, E, H);
  const std::vector<double> dz = test::to_f64(dlogits);
  std::vector<double> ana_x = test::to_f64(dx), ana_W(static_cast<size_t>(K * H), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < K; ++e)
      for (int64_t h = 0; h < H; ++h) {
        ana_W[e * H + h] += dz[n * K + e] * xd[n * H + h];
        ana_x[n * H + h] += dz[n * K + e] * Wd[e * H + h];
      }

  const double eps = 1e-6;
  auto numeric = [&](std::vector<double> v, bool of_x) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i];
      v[i] = keep + eps;
      const double lp = of_x ? ref.loss(v, Wd, gd, fixed) : ref.loss(xd, v, gd, fixed);
      v[i] = keep - eps;
      const double lm = of_x ? ref.loss(v, Wd, gd, fixed) : ref.loss(xd, v, gd, fixed);
      v[i] = keep;
      d[i] = (lp - lm) / (2 * eps);
    }
    return d;
  };
  const std::vector<double> num_x = numeric(xd, true), num_W = numeric(Wd, false);
  EXPECT_LT(test::rel_error(ana_x, num_x), 1e-5) << "dL/dx";
  EXPECT_LT(test::rel_error(ana_W, num_W), 1e-5) << "dL/dW (the router's weights, through p_skip)";
  // The input gradient has both paths: the passthrough alone is not the whole of it.
  std::vector<double> pass_only = test::to_f64(dx);
  EXPECT_GT(test::rel_error(pass_only, num_x), 1e-2) << "the router path must contribute to dL/dx";
}

TEST(MoeSkip, BackwardsLeaveRoutedRowsAlone) {
  const int64_t N = 6, E = 2, H = 4, K = E + 1;
  Tensor x = random_tensor({N, H}, 21), probs = random_tensor({N, K}, 22), g = random_tensor({N, H}, 23);
  Tensor choice = Tensor::empty({N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>(n % K);  // rows 2, 5 skip
  Tensor dx = random_tensor({N, H}, 24), dl = random_tensor({N, K}, 25);
  Tensor dx0 = dx.clone(), dl0 = dl.clone();
  moe_skip_input_backward(dx, g, probs, choice, N, E, H);
  moe_skip_router_backward(dl, g, x, probs, choice, N, E, H);
  for (int64_t n = 0; n < N; ++n) {
    const bool skip = n % K == E;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t i = n * H + h;
      const float want = skip ? dx0.data<float>()[i] + probs.data<float>()[n * K + E] * g.data<float>()[i]
                              : dx0.data<float>()[i];
      EXPECT_EQ(dx.data<float>()[i], want) << "dx accumulates on skipped rows only, at " << n;
    }
    if (!skip) {
      for (int64_t e = 0; e < K; ++e) EXPECT_EQ(dl.data<float>()[n * K + e], dl0.data<float>()[n * K + e]) << n;
    }
  }
}

TEST(MoeSkip, BadArgumentsNameTheOpAndTheArgument) {
  const int64_t N = 4, E = 2, H = 3;
  Tensor x = Tensor::zeros({N, H}, DType::f32), out = Tensor::zeros({N, H}, DType::f32), probs = Tensor::zeros({N, E + 1}, DType::f32);
  Tensor choice = Tensor::zeros({N}, DType::i32), dl = Tensor::zeros({N, E + 1}, DType::f32);
  auto msg = [](const std::function<void()>& f) { return test::error_of(f); };
  EXPECT_NE(msg([&] { moe_skip_forward(out, x, Tensor::zeros({N, E}, DType::f32), choice, N, E, H); }).find("moe_skip_forward: probs"),
            std::string::npos);
  EXPECT_NE(msg([&] { moe_skip_forward(out, x, probs, Tensor::zeros({N}, DType::f32), N, E, H); }).find("choice"), std::string::npos);
  EXPECT_NE(msg([&] { moe_skip_input_backward(Tensor::zeros({N, H + 1}, DType::f32), x, probs, choice, N, E, H); })
                .find("moe_skip_input_backward: dx"),
            std::string::npos);
  EXPECT_NE(msg([&] { moe_skip_router_backward(Tensor::zeros({N, E}, DType::f32), x, x, probs, choice, N, E, H); })
                .find("moe_skip_router_backward: dlogits"),
            std::string::npos);
}

// Handed CUDA tensors (host memory labelled CUDA: device_dispatch.h) without a GPU, the fronts stop
// at the device context naming the op; mixed devices name the argument. With a GPU,
// test_moe_skip_cuda.cc runs the kernels.
TEST(MoeSkipDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  const int64_t N = 4, E = 2, H = 3;
  Tensor x = cu({N, H}), out = cu({N, H}), probs = cu({N, E + 1}), choice = cu({N}, DType::i32), dl = cu({N, E + 1});
  Tensor choice_cpu = Tensor::zeros({N}, DType::i32);
  test::expect_mixed_devices("moe_skip_forward", "choice", [&] { moe_skip_forward(out, x, probs, choice_cpu, N, E, H); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_moe_skip_cuda.cc runs these ops on it";
  test::expect_needs_gpu("moe_skip_forward", [&] { moe_skip_forward(out, x, probs, choice, N, E, H); });
  test::expect_needs_gpu("moe_skip_input_backward", [&] { moe_skip_input_backward(out, x, probs, choice, N, E, H); });
  test::expect_needs_gpu("moe_skip_router_backward",
                         [&] { moe_skip_router_backward(dl, out, x, probs, choice, N, E, H); });
}

}  // namespace
}  // namespace zaya::ops
