// EDA (ops::eda_forward / eda_backward) and the input bias-then-scale (ops::scale_bias_*) against
// float64 references and central differences; the parameter gradients' row sums do not depend on
// the thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gradcheck.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"
#include "zaya/ops/router_state.h"
#include "zaya/ops/scale_bias.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;

// 300 rows: more than one of the backward's 256-row chunks.
constexpr int64_t N = 300, R = 6;

TEST(Eda, ForwardAndBackwardMatchFloat64) {
  Tensor h = random_tensor({N, R}, 1), r_prev = random_tensor({N, R}, 2), s = random_tensor({R}, 3);
  Tensor r = h.clone();
  eda_forward(r, r_prev, s);
  const std::vector<double> hh = to_f64(h), rp = to_f64(r_prev), ss = to_f64(s);
  std::vector<double> ref(N * R);
  for (int64_t i = 0; i < N * R; ++i) ref[i] = hh[i] + ss[i % R] * rp[i];
  EXPECT_LT(test::rel_error(r, ref), 1e-6);

  // Backward of L = Σ g ⊙ r (g = what this layer's router sends) + Σ c ⊙ r (the carry from above):
  // dr = g + c, ds = Σ_rows dr ⊙ r_prev, carry down = dr ⊙ s.
  Tensor g = random_tensor({N, R}, 4), c = random_tensor({N, R}, 5);
  Tensor dr = g.clone(), carried = c.clone(), ds = Tensor::zeros({R}, DType::f32);
  eda_backward(dr, carried, ds, r_prev, s);
  const std::vector<double> gg = to_f64(g), cc = to_f64(c);
  auto loss_s = [&](const std::vector<double>& sv) {
    double L = 0;
    for (int64_t i = 0; i < N * R; ++i) L += (gg[i] + cc[i]) * (hh[i] + sv[i % R] * rp[i]);
    return L;
  };
  auto loss_rp = [&](const std::vector<double>& rpv) {
    double L = 0;
    for (int64_t i = 0; i < N * R; ++i) L += (gg[i] + cc[i]) * (hh[i] + ss[i % R] * rpv[i]);
    return L;
  };
  EXPECT_LT(test::rel_error(ds, test::numerical_gradient(loss_s, ss)), 1e-5);
  EXPECT_LT(test::rel_error(carried, test::numerical_gradient(loss_rp, rp)), 1e-5);
  std::vector<double> dr_ref(N * R);
  for (int64_t i = 0; i < N * R; ++i) dr_ref[i] = gg[i] + cc[i];
  EXPECT_LT(test::rel_error(dr, dr_ref), 1e-7);

  // Layer 0: no EDA, the carry is only added.
  Tensor dr0 = g.clone();
  eda_backward(dr0, c, Tensor{}, Tensor{}, Tensor{});
  EXPECT_LT(test::rel_error(dr0, dr_ref), 1e-7);
  EXPECT_THROW(eda_backward(dr0, c, Tensor{}, r_prev, Tensor{}), Error);
}

TEST(ScaleBias, ForwardAndBackwardMatchFloat64) {
  Tensor x = random_tensor({N, R}, 6), b = random_tensor({R}, 7), gw = random_tensor({R}, 8);
  Tensor y = Tensor::empty({N, R}, DType::f32);
  scale_bias_forward(y, x, b, gw);
  const std::vector<double> xx = to_f64(x), bb = to_f64(b), ww = to_f64(gw);
  std::vector<double> ref(N * R);
  for (int64_t i = 0; i < N * R; ++i) ref[i] = (xx[i] + bb[i % R]) * ww[i % R];
  EXPECT_LT(test::rel_error(y, ref), 1e-6);

  Tensor dy = random_tensor({N, R}, 9), dx = Tensor::empty({N, R}, DType::f32);
  Tensor db = Tensor::zeros({R}, DType::f32), dg = Tensor::zeros({R}, DType::f32);
  scale_bias_backward(dx, db, dg, dy, x, b, gw);
  const std::vector<double> d = to_f64(dy);
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& bv, const std::vector<double>& wv) {
    double L = 0;
    for (int64_t i = 0; i < N * R; ++i) L += d[i] * (xv[i] + bv[i % R]) * wv[i % R];
    return L;
  };
  EXPECT_LT(test::rel_error(dx, test::numerical_gradient([&](auto& v) { return loss(v, bb, ww); }, xx)), 1e-5);
  EXPECT_LT(test::rel_error(db, test::numerical_gradient([&](auto& v) { return loss(xx, v, ww); }, bb)), 1e-5);
  EXPECT_LT(test::rel_error(dg, test::numerical_gradient([&](auto& v) { return loss(xx, bb, v); }, ww)), 1e-5);
  EXPECT_THROW(scale_bias_forward(y, x, b, random_tensor({R + 1}, 1)), Error);
}

TEST(RouterState, ParameterGradientsDoNotDependOnThreads) {
  Tensor x = random_tensor({N, R}, 6), b = random_tensor({R}, 7), gw = random_tensor({R}, 8), dy = random_tensor({N, R}, 9);
  Tensor r_prev = random_tensor({N, R}, 2);
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor dx = Tensor::empty({N, R}, DType::f32), db = Tensor::zeros({R}, DType::f32),
           dg = Tensor::zeros({R}, DType::f32), ds = Tensor::zeros({R}, DType::f32);
    scale_bias_backward(dx, db, dg, dy, x, b, gw);
    Tensor dr = dy.clone(), carried = x.clone();
    eda_backward(dr, carried, ds, r_prev, gw);
    std::vector<float> all;
    for (const Tensor* t : {&db, &dg, &ds, &carried}) all.insert(all.end(), t->data<float>(), t->data<float>() + t->numel());
    runs.push_back(all);
  }
  set_num_threads(default_num_threads());
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

// With CUDA kernels (cuda/router_state.cu, cuda/scale_bias.cu), CUDA tensors where no GPU is present
// give a zaya::Error naming the op before any kernel runs (host memory under a CUDA label: skipped
// with a GPU, where test_dense_cuda.cc runs the ops on device memory); mixed devices name the
// argument.
TEST(RouterStateDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  Tensor r = cu({N, R}), rp = cu({N, R}), s = cu({R}), ds = cu({R}), c = cu({N, R});
  Tensor x = cu({N, R}), b = cu({R}), g = cu({R}), y = cu({N, R}), db = cu({R}), dg = cu({R});
  Tensor s_cpu = Tensor::zeros({R}, DType::f32);
  test::expect_mixed_devices("eda_forward", "s", [&] { eda_forward(r, rp, s_cpu); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_dense_cuda.cc runs these ops on it";
  test::expect_needs_gpu("eda_forward", [&] { eda_forward(r, rp, s); });
  test::expect_needs_gpu("eda_backward", [&] { eda_backward(r, c, ds, rp, s); });
  test::expect_needs_gpu("scale_bias_forward", [&] { scale_bias_forward(y, x, b, g); });
  test::expect_needs_gpu("scale_bias_backward", [&] { scale_bias_backward(x, db, dg, y, x, b, g); });
}

}  // namespace
}  // namespace zaya::ops
