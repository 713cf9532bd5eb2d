// The cross-entropy's per-element math that the CUDA kernels run (ops/loss_math.h), run here on the
// host against the CPU op and float64, so what a GPU computes is tested on machines without one.
// The CPU kernels keep their vectorized exp (expf_fast), so the two agree to a few ulp, not bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/loss_reference.h"
#include "zaya/ops/loss.h"
#include "zaya/ops/loss_math.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

// The online logsumexp over chunks of 7 columns (as the CUDA row kernel runs it, per chunk: the max,
// lse_raise_max, Σexp relative to the new max) against float64, for logits spread ±60 and ±0.1.
// Tolerance 1e-6 relative on lse (≥ 1 here, so an absolute ~1e-6): Σ of ≤ 500 terms ≤ 1 in float,
// each exp within 1 ulp, plus the rescales' few roundings.
TEST(LossMath, OnlineLogsumexpOverChunksMatchesFloat64) {
  for (float scale : {60.0f, 0.1f}) {
    const int64_t V = 500;
    Tensor x = random_tensor({V}, 61, scale);
    const float* p = x.data<float>();
    float m = -INFINITY, sum = 0.0f;
    for (int64_t v0 = 0; v0 < V; v0 += 7) {
      const int64_t c = std::min<int64_t>(7, V - v0);
      float cm = -INFINITY;
      for (int64_t j = 0; j < c; ++j) cm = std::max(cm, p[v0 + j]);
      math::lse_raise_max(m, sum, cm);
      for (int64_t j = 0; j < c; ++j) sum += expf(p[v0 + j] - m);
    }
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max<double>(mx, p[j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(p[j] - mx);
    const double want = mx + std::log(s);
    EXPECT_NEAR(m + std::log(sum), want, 1e-6 * std::max(1.0, std::fabs(want))) << "scale " << scale;
  }
}

// xent_logit_grad against the CPU op's gradient (cross_entropy_logits_backward), element by
// element, from the CPU's own lse. Both are exp(logit − lse)·(1/count) − [target]·(1/count) with
// the same roundings; only the exp differs (expf vs expf_fast, ≤ 2 ulp together), and an element
// within those ulp of the 2^-100 flush may be 0 on one side: |Δ| ≤ 4 ulp of the value + 2^-100/count.
TEST(LossMath, LogitGradientMatchesTheCpuOp) {
  const int64_t n = 9, V = 700;
  Tensor logits = random_tensor({n, V}, 62, 40.0f);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 97) % V);
  t[3] = -100;
  Tensor tg = loss_test::make_targets(t), lse = Tensor::empty({n}, DType::f32);
  const CrossEntropyResult r = cross_entropy_logits_forward(lse, logits, tg);
  Tensor g = logits.clone();
  cross_entropy_logits_backward(g, lse, tg, r.count);
  const float inv_count = 1.0f / static_cast<float>(r.count);
  int64_t flushed = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == -100) continue;
    for (int64_t j = 0; j < V; ++j) {
      const float want = g.data<float>()[i * V + j];
      const float got =
          math::xent_logit_grad(logits.data<float>()[i * V + j], lse.data<float>()[i], inv_count, j == t[i]);
      flushed += got == 0.0f;
      EXPECT_LE(std::fabs(got - want), 4.8e-7 * std::fabs(want) + 0x1p-100 * inv_count) << i << ", " << j;
    }
  }
  EXPECT_GT(flushed, 0);  // the flush was exercised
}

}  // namespace
}  // namespace zaya::ops
