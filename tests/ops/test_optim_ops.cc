// Optimizer primitives against float64: gradient norm and clipping, AdamW over several steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gradcheck.h"
#include "zaya/core/threads.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/grad_wire.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;

std::vector<Tensor> some_grads() {
  // Sizes on both sides of the 16 Ki-element block, including odd ones.
  return {random_tensor({7, 13}, 1), random_tensor({40000}, 2, 0.01f), random_tensor({1}, 3),
          random_tensor({129, 257}, 4, 3.0f)};
}

TEST(GradNorm, MatchesDoubleAndIsThreadIndependent) {
  std::vector<Tensor> grads = some_grads();
  double ref = 0;
  for (const Tensor& g : grads)
    for (double x : to_f64(g)) ref += x * x;
  ref = std::sqrt(ref);
  int saved = num_threads();
  set_num_threads(1);
  double one = global_grad_norm(grads);
  set_num_threads(2);
  double two = global_grad_norm(grads);
  set_num_threads(saved);
  // Squares of floats are exact in double; only ~8e4 double additions round: ~1e-16·sqrt(n).
  EXPECT_NEAR(one, ref, 1e-12 * ref);
  EXPECT_EQ(one, two);  // bitwise: blocks are fixed, not per-thread
}

TEST(GradNorm, ClipScalesOnlyAboveTheLimit) {
  std::vector<Tensor> grads = some_grads();
  std::vector<Vec> before;
  for (const Tensor& g : grads) before.push_back(to_f64(g));
  double norm = global_grad_norm(grads);
  EXPECT_EQ(clip_grad_norm(grads, 2 * norm), norm);  // under the limit: untouched
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(to_f64(grads[i]), before[i]);
  double max_norm = norm / 4;
  EXPECT_EQ(clip_grad_norm(grads, max_norm), norm);
  // After clipping the norm is max_norm·norm/(norm + 1e-6); f32 rounding of the scaled entries
  // moves it by ~1e-7 relative.
  EXPECT_NEAR(global_grad_norm(grads), max_norm * norm / (norm + 1e-6), 1e-6 * max_norm);
  double coef = max_norm / (norm + 1e-6);
  for (size_t i = 0; i < grads.size(); ++i) {
    Vec expect = before[i];
    for (double& x : expect) x *= coef;
    EXPECT_LT(test::rel_error(grads[i], expect), 1e-7);  // one f32 multiply: <= 2^-24 relative
  }
  EXPECT_THROW(clip_grad_norm(grads, 0.0), Error);
}

TEST(AdamW, MatchesDoubleOverSeveralSteps) {
  const Shape s{7, 13};
  Tensor p = random_tensor(s, 1), m = Tensor::zeros(s, DType::f32), v = Tensor::zeros(s, DType::f32);
  AdamWHyper hp{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Vec P = to_f64(p), M(P.size(), 0.0), V(P.size(), 0.0);
  for (int64_t t = 1; t <= 4; ++t) {
    Tensor g = random_tensor(s, 10 + t);
    Vec G = to_f64(g);
    adamw_update(p, m, v, g, hp, t);
    double b1 = hp.beta1, b2 = hp.beta2;  // the f32 hyperparameters, exactly
    for (size_t i = 0; i < P.size(); ++i) {
      M[i] = b1 * M[i] + (1 - b1) * G[i];
      V[i] = b2 * V[i] + (1 - b2) * G[i] * G[i];
      double mh = M[i] / (1 - std::pow(b1, t)), vh = V[i] / (1 - std::pow(b2, t));
      P[i] -= double(hp.lr) * (mh / (std::sqrt(vh) + double(hp.eps)) + double(hp.weight_decay) * P[i]);
    }
    // Each step rounds ~10 f32 operations per element; four steps stay within ~1e-6 relative.
    EXPECT_LT(test::rel_error(m, M), 1e-6) << "step " << t;
    EXPECT_LT(test::rel_error(v, V), 1e-6) << "step " << t;
    EXPECT_LT(test::rel_error(p, P), 1e-6) << "step " << t;
  }
  Tensor g = random_tensor(s, 99);
  EXPECT_THROW(adamw_update(p, m, v, g, hp, 0), Error);
  Tensor bad = random_tensor({13, 7}, 1);
  EXPECT_THROW(adamw_update(p, m, v, bad, hp, 1), Error);
}

// A moment that would fall below float's normal range is stored as 0 (x86 runs arithmetic on
// subnormals through microcode assists: the embedding rows of tokens no batch holds decay into that
// range in ~650 steps). Normal moments are untouched, and the scalar path agrees (one element).
TEST(AdamW, SubnormalMomentsAreStoredAsZero) {
  AdamWHyper hp{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f};
  for (int64_t n : {int64_t{32}, int64_t{1}}) {
    Tensor p = Tensor::empty({n}, DType::f32), g = Tensor::zeros({n}, DType::f32);
    Tensor m = Tensor::empty({n}, DType::f32), v = Tensor::empty({n}, DType::f32);
    p.fill_(0.5);
    for (int64_t i = 0; i < n; ++i) {
      // even elements: just above the normal minimum, so 0.9·m (0.95·v) is subnormal;
      // odd elements: still normal after the step
      const float mag = i % 2 == 0 ? 1.05f * FLT_MIN : 1e-20f;
      m.data<float>()[i] = i % 4 == 0 ? -mag : mag;
      v.data<float>()[i] = mag;
    }
    adamw_update(p, m, v, g, hp, 10);
    for (int64_t i = 0; i < n; ++i) {
      const float mi = m.data<float>()[i], vi = v.data<float>()[i];
      if (i % 2 == 0) {
        EXPECT_EQ(mi, 0.0f) << i;
        EXPECT_EQ(vi, 0.0f) << i;
        EXPECT_EQ(p.data<float>()[i], 0.5f) << i;  // a zero moment moves nothing (no decay here)
      } else {
        EXPECT_EQ(mi, 0.9f * 1e-20f) << i;
        EXPECT_EQ(vi, 0.95f * 1e-20f) << i;
        EXPECT_TRUE(std::isnormal(mi) && std::isnormal(vi)) << i;
      }
    }
  }
}

// The optimizer fronts handed CUDA tensors (host memory labelled CUDA: device_dispatch.h) name the
// argument on another device; where no GPU is present their CUDA kernels (cuda/optim_ops.cu) say
// so naming the op, before anything is launched (with a GPU, test_optim_cuda.cc runs them).
// The bf16 weights of mixed precision, rounded from the fp32 masters (cast_to_bf16): every element
// becomes the nearest bf16 (ties to even, the rule of the hardware conversions), computed here from
// the bits; rounding the widened values again changes nothing, and the gradient wire's conversions
// carry them exactly.
TEST(WeightRounding, NearestEvenIdempotentAndExactOnTheWire) {
  const auto round_to_bf16 = [](const Tensor& x) {
    Tensor b = Tensor::empty(x.shape(), DType::bf16, x.device());
    cast_to_bf16(b, x);
    cast_to_f32(x, b);
  };
  const float one_ulp = std::ldexp(1.0f, -7);  // bf16's spacing in [1, 2)
  std::vector<float> v = {1.0f, 1.0f + one_ulp / 2,  // a tie: down to the even 1.0
                          1.0f + 1.5f * one_ulp,     // a tie: up to the even 1 + 2 ulp
                          1.0f + one_ulp / 2 + std::ldexp(1.0f, -20), -3.14159f, 0.0f, -0.0f, 1e-40f,
                          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 3.4e38f};
  Tensor x = Tensor::empty({static_cast<int64_t>(v.size())}, DType::f32);
  std::memcpy(x.data<float>(), v.data(), v.size() * sizeof(float));
  round_to_bf16(x);
  const float* r = x.data<float>();
  EXPECT_EQ(r[0], 1.0f);
  EXPECT_EQ(r[1], 1.0f);
  EXPECT_EQ(r[2], 1.0f + 2 * one_ulp);
  EXPECT_EQ(r[3], 1.0f + one_ulp);  // above the tie: up
  EXPECT_EQ(r[4], -3.140625f);
  EXPECT_TRUE(std::isinf(r[8]) && std::isnan(r[9]));
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &r[i], sizeof bits);
    if (!std::isnan(r[i])) {
      EXPECT_EQ(bits & 0xffffu, 0u) << "element " << i << " keeps bits below bf16's";
    }
  }
  Tensor big = random_tensor({50001}, 9, 5.0f), once = Tensor::empty({50001}, DType::f32);
  round_to_bf16(big);
  once.copy_from(big);
  round_to_bf16(big);
  Tensor wire = Tensor::empty({50001}, DType::bf16), back = Tensor::empty({50001}, DType::f32);
  to_bf16_wire(wire, once);
  from_bf16_wire(back, wire, 1.0f);
  EXPECT_EQ(std::memcmp(big.data<float>(), once.data<float>(), 50001 * sizeof(float)), 0) << "idempotent";
  EXPECT_EQ(std::memcmp(back.data<float>(), once.data<float>(), 50001 * sizeof(float)), 0) << "exact on the wire";
}

TEST(OptimOpsDevice, MixedDevicesNameTheArgumentAndCudaTensorsNeedAGpu) {
  test::CudaLabelled cu;
  Tensor p = cu({5, 3}), g = cu({5, 3}), m = cu({5, 3}), v = cu({5, 3});
  const std::vector<Tensor> grads{g, cu({7})};
  Tensor m_cpu = Tensor::zeros({5, 3}, DType::f32);
  test::expect_mixed_devices("adamw_update", "m", [&] { adamw_update(p, m_cpu, v, g, AdamWHyper{}, 1); });
  const std::vector<Tensor> mixed{g, Tensor::zeros({7}, DType::f32)};
  test::expect_mixed_devices("global_grad_norm", "gradient 1", [&] { global_grad_norm(mixed); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_optim_cuda.cc runs these ops on it";
  using test::expect_needs_gpu;
  expect_needs_gpu("global_grad_norm", [&] { global_grad_norm(grads); });
  expect_needs_gpu("global_grad_norm", [&] { clip_grad_norm(grads, 1.0); });
  expect_needs_gpu("scale_inplace", [&] { scale_inplace(g, 0.5f); });
  expect_needs_gpu("adamw_update", [&] { adamw_update(p, m, v, g, AdamWHyper{}, 1); });
}

}  // namespace
}  // namespace zaya::ops
