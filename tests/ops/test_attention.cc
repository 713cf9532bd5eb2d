// Attention against a naive float64 softmax attention (forward and analytic backward), the float64
// reference's own gradient checked by central differences, decode against the full forward, and
// bitwise determinism across runs and thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ops/device_dispatch.h"
#include "gradcheck.h"
#include "zaya/core/threads.h"
#include "zaya/ops/attention.h"

namespace zaya {
namespace {

using test::rel_error;
using test::to_f64;
using V = std::vector<double>;

struct Dims {
  int64_t B, T, nq, nkv, hd;
};

// Naive causal GQA attention in double: o [B,T,nq,hd], lse [B,nq,T].
void ref_forward(const Dims& d, const V& q, const V& k, const V& v, V& o, V& lse) {
  const int64_t G = d.nq / d.nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  o.assign(d.B * d.T * d.nq * d.hd, 0.0);
  lse.assign(d.B * d.nq * d.T, 0.0);
  std::vector<double> s(d.T);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nq; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        const int64_t hk = h / G;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < d.hd; ++x)
            acc += q[((b * d.T + i) * d.nq + h) * d.hd + x] * k[((b * d.T + j) * d.nkv + hk) * d.hd + x];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        for (int64_t j = 0; j <= i; ++j) {
          double p = std::exp(s[j] - mx) / sum;
          for (int64_t x = 0; x < d.hd; ++x)
            o[((b * d.T + i) * d.nq + h) * d.hd + x] += p * v[((b * d.T + j) * d.nkv + hk) * d.hd + x];
        }
        lse[(b * d.nq + h) * d.T + i] = mx + std::log(sum);
      }
}

// Analytic backward of the naive attention in double (P materialized per row).
void ref_backward(const Dims& d, const V& q, const V& k, const V& v, const V& dout, V& dq, V& dk, V& dv) {
  const int64_t G = d.nq / d.nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  V o, lse;
  ref_forward(d, q, k, v, o, lse);
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nq; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        const int64_t hk = h / G, qi = ((b * d.T + i) * d.nq + h) * d.hd;
        double D = 0;
        for (int64_t x = 0; x < d.hd; ++x) D += dout[qi + x] * o[qi + x];
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t kj = ((b * d.T + j) * d.nkv + hk) * d.hd;
          double s = 0, dp = 0;
          for (int64_t x = 0; x < d.hd; ++x) s += q[qi + x] * k[kj + x], dp += dout[qi + x] * v[kj + x];
          double p = std::exp(s * scale - lse[(b * d.nq + h) * d.T + i]);
          double ds = p * (dp - D);
          for (int64_t x = 0; x < d.hd; ++x) {
            dv[kj + x] += p * dout[qi + x];
            dq[qi + x] += scale * ds * k[kj + x];
            dk[kj + x] += scale * ds * q[qi + x];
          }
        }
      }
}

struct AttnRun {
  Tensor q, k, v, o, lse, dout, dq, dk, dv;
};

// q_scale > 1 spreads the scores (peaky rows).
AttnRun make_run(const Dims& d, uint64_t seed, float q_scale = 1.0f) {
  AttnRun r;
  r.q = test::random_tensor(Shape{d.B, d.T, d.nq, d.hd}, seed, q_scale);
  r.k = test::random_tensor(Shape{d.B, d.T, d.nkv, d.hd}, seed + 1);
  r.v = test::random_tensor(Shape{d.B, d.T, d.nkv, d.hd}, seed + 2);
  r.dout = test::random_tensor(Shape{d.B, d.T, d.nq, d.hd}, seed + 3);
  // Outputs start as NaN: every element must be written, none may be added to what was there
  // (the model reuses its buffers, so a kernel that accumulated into them would be wrong there).
  r.o = Tensor::empty(r.q.shape(), DType::f32);
  r.lse = Tensor::empty(Shape{d.B, d.nq, d.T}, DType::f32);
  r.dq = Tensor::empty(r.q.shape(), DType::f32);
  r.dk = Tensor::empty(r.k.shape(), DType::f32);
  r.dv = Tensor::empty(r.v.shape(), DType::f32);
  for (Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) t->fill_(std::nan(""));
  ops::attention_forward(r.o, r.lse, r.q, r.k, r.v, d.B, d.T, d.nq, d.nkv, d.hd);
  ops::attention_backward(r.dq, r.dk, r.dv, r.dout, r.q, r.k, r.v, r.o, r.lse, d.B, d.T, d.nq, d.nkv, d.hd);
  return r;
}

class AttentionShapes : public ::testing::TestWithParam<Dims> {};

TEST_P(AttentionShapes, ForwardAndBackwardMatchFloat64) {
  const Dims d = GetParam();
  AttnRun r = make_run(d, 100 + d.T);
  V o, lse, dq, dk, dv;
  ref_forward(d, to_f64(r.q), to_f64(r.k), to_f64(r.v), o, lse);
  ref_backward(d, to_f64(r.q), to_f64(r.k), to_f64(r.v), to_f64(r.dout), dq, dk, dv);
  // fp32 dot products of length hd and sums of up to T exp terms: a few 1e-7 relative each.
  EXPECT_LT(rel_error(r.o, o), 2e-6);
  EXPECT_LT(test::max_abs_diff(to_f64(r.lse), lse), 2e-5);  // lse ~ log T + O(|s|): fp32 ulps of that
  // Backward adds the cancellation in dS = P(dP − D) and sums over up to T·G terms.
  if (d.T == 1) {
    // One key: P = 1 and dS = dP − D = 0 exactly, so dq = dk = 0; fp32 leaves the cancellation's ulps.
    EXPECT_LT(test::max_abs_diff(to_f64(r.dq), dq), 1e-5);
    EXPECT_LT(test::max_abs_diff(to_f64(r.dk), dk), 1e-5);
  } else {
    EXPECT_LT(rel_error(r.dq, dq), 2e-5);
    EXPECT_LT(rel_error(r.dk, dk), 2e-5);
  }
  EXPECT_LT(rel_error(r.dv, dv), 2e-5);
}

// T crosses the 64-row tile boundaries (and, at 600, the forward's 512-key softmax chunk, so rows
// past it merge two chunks online); hd, B and the GQA ratio vary.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Values(Dims{1, 1, 4, 2, 16}, Dims{2, 5, 2, 2, 32}, Dims{3, 5, 4, 1, 64},
                                           Dims{1, 63, 4, 2, 16}, Dims{1, 64, 4, 1, 32}, Dims{2, 65, 2, 2, 16},
                                           Dims{1, 67, 4, 2, 64}, Dims{1, 130, 4, 2, 16},
                                           Dims{1, 600, 4, 2, 16}));

// Peaky rows (q scaled ×40: scores spread over ±100s) drive most probabilities below float's
// normal range; the kernels store those below 2^-100 as 0 (they would otherwise run the tile
// products through microcode assists). The result must still be the float64 softmax's: a dropped
// term is < 2^-100 of its row's largest.
TEST(Attention, PeakyScoresMatchFloat64) {
  const Dims d{2, 130, 4, 2, 32};
  AttnRun r = make_run(d, 7, 40.0f);
  V o, lse, dq, dk, dv;
  ref_forward(d, to_f64(r.q), to_f64(r.k), to_f64(r.v), o, lse);
  ref_backward(d, to_f64(r.q), to_f64(r.k), to_f64(r.v), to_f64(r.dout), dq, dk, dv);
  // Scores of size ~100 carry fp32 rounding of ~1e-5 absolute, which exp turns into that much
  // relative error in each probability: bounds 10× the unit-scale test's for everything.
  EXPECT_LT(rel_error(r.o, o), 2e-5);
  EXPECT_LT(test::max_abs_diff(to_f64(r.lse), lse), 2e-4);
  EXPECT_LT(rel_error(r.dq, dq), 2e-4);
  EXPECT_LT(rel_error(r.dk, dk), 2e-4);
  EXPECT_LT(rel_error(r.dv, dv), 2e-4);
}

TEST(Attention, Float64ReferenceGradientMatchesFiniteDifferences) {
  // Validates ref_backward (hence the analytic gradients above) on a small problem.
  const Dims d{1, 5, 4, 2, 16};
  AttnRun r = make_run(d, 7);
  V q = to_f64(r.q), k = to_f64(r.k), v = to_f64(r.v), g = to_f64(r.dout);
  auto loss = [&](const V& qq, const V& kk, const V& vv) {
    V o, lse;
    ref_forward(d, qq, kk, vv, o, lse);
    return test::dot(o, g);
  };
  V dq, dk, dv;
  ref_backward(d, q, k, v, g, dq, dk, dv);
  V nq = test::numerical_gradient([&](const V& x) { return loss(x, k, v); }, q);
  V nk = test::numerical_gradient([&](const V& x) { return loss(q, x, v); }, k);
  V nv = test::numerical_gradient([&](const V& x) { return loss(q, k, x); }, v);
  // Central differences in double with h = 1e-6: ~1e-9 relative error.
  EXPECT_LT(rel_error(dq, nq), 1e-7);
  EXPECT_LT(rel_error(dk, nk), 1e-7);
  EXPECT_LT(rel_error(dv, nv), 1e-7);
  // And our fp32 backward against the same numbers (fp32 rounding only).
  EXPECT_LT(rel_error(r.dq, nq), 2e-5);
  EXPECT_LT(rel_error(r.dk, nk), 2e-5);
  EXPECT_LT(rel_error(r.dv, nv), 2e-5);
}

TEST(Attention, DecodeMatchesFullForwardAtEveryPosition) {
  const Dims d{2, 70, 4, 2, 32};
  AttnRun r = make_run(d, 11);
  const int64_t rowq = d.nq * d.hd, rowk = d.nkv * d.hd;
  Tensor kc = Tensor::zeros(Shape{d.B, d.T, d.nkv, d.hd}, DType::f32);
  Tensor vc = Tensor::zeros(Shape{d.B, d.T, d.nkv, d.hd}, DType::f32);
  Tensor q1 = Tensor::empty(Shape{d.B, d.nq, d.hd}, DType::f32), o1 = q1.clone();
  for (int64_t t = 0; t < d.T; ++t) {
    for (int64_t b = 0; b < d.B; ++b) {
      std::memcpy(kc.data<float>() + (b * d.T + t) * rowk, r.k.data<float>() + (b * d.T + t) * rowk, rowk * 4);
      std::memcpy(vc.data<float>() + (b * d.T + t) * rowk, r.v.data<float>() + (b * d.T + t) * rowk, rowk * 4);
      std::memcpy(q1.data<float>() + b * rowq, r.q.data<float>() + (b * d.T + t) * rowq, rowq * 4);
    }
    ops::attention_decode(o1, q1, kc, vc, d.B, t + 1, d.nq, d.nkv, d.hd);
    V got = to_f64(o1), want(d.B * rowq);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t x = 0; x < rowq; ++x) want[b * rowq + x] = r.o.data<float>()[(b * d.T + t) * rowq + x];
    // Same math, different fp32 summation order (one pass vs tiles): rounding only.
    ASSERT_LT(rel_error(got, want), 1e-5) << "position " << t;
  }
}

TEST(Attention, BitwiseDeterministicAcrossRunsAndThreads) {
  const Dims d{2, 600, 4, 2, 32};  // past the forward's 512-key chunk
  const int saved = num_threads();
  set_num_threads(1);
  AttnRun a = make_run(d, 5);
  set_num_threads(2);
  AttnRun b = make_run(d, 5), c = make_run(d, 5);
  set_num_threads(saved);
  for (auto [x, y, z] : {std::tuple{&a.o, &b.o, &c.o}, {&a.lse, &b.lse, &c.lse}, {&a.dq, &b.dq, &c.dq},
                         {&a.dk, &b.dk, &c.dk}, {&a.dv, &b.dv, &c.dv}}) {
    EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0);
    EXPECT_EQ(std::memcmp(y->raw(), z->raw(), y->nbytes()), 0);
  }
}

TEST(Attention, RejectsBadShapes) {
  Tensor q = Tensor::zeros(Shape{1, 4, 4, 16}, DType::f32), k = Tensor::zeros(Shape{1, 4, 2, 16}, DType::f32);
  Tensor o = q.clone(), lse = Tensor::zeros(Shape{1, 4, 4}, DType::f32);
  Tensor bad_k = Tensor::zeros(Shape{1, 4, 3, 16}, DType::f32);
  EXPECT_THROW(ops::attention_forward(o, lse, q, bad_k, k, 1, 4, 4, 2, 16), Error);
  EXPECT_THROW(ops::attention_forward(o, lse, q, k, k, 1, 4, 4, 3, 16), Error);  // nq % nkv
  try {
    ops::attention_forward(o, lse, q, bad_k, k, 1, 4, 4, 2, 16);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 4, 32]"), std::string::npos) << e.what();
  }
}

// With CUDA kernels (cuda/attention.cu), CUDA tensors where no GPU is present give a zaya::Error
// naming the op before any kernel runs (host memory under a CUDA label: skipped with a GPU, where
// test_attention_cuda.cc runs the ops on device memory); mixed devices name the argument.
TEST(AttentionDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  const int64_t B = 1, T = 2, nq = 2, nkv = 1, hd = 4;
  Tensor q = cu({B, T, nq * hd}), k = cu({B, T, nkv * hd}), v = cu({B, T, nkv * hd});
  Tensor out = cu({B, T, nq * hd}), lse = cu({B, nq, T});
  Tensor dq = cu({B, T, nq * hd}), dk = cu({B, T, nkv * hd}), dv = cu({B, T, nkv * hd}), dout = cu({B, T, nq * hd});
  Tensor q1 = cu({B, nq * hd}), out1 = cu({B, nq * hd}), kc = cu({B, T, nkv, hd}), vc = cu({B, T, nkv, hd});
  Tensor v_cpu = Tensor::zeros({B, T, nkv * hd}, DType::f32);
  test::expect_mixed_devices("attention_forward", "v",
                             [&] { ops::attention_forward(out, lse, q, k, v_cpu, B, T, nq, nkv, hd); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_attention_cuda.cc runs these ops on it";
  test::expect_needs_gpu("attention_forward", [&] { ops::attention_forward(out, lse, q, k, v, B, T, nq, nkv, hd); });
  test::expect_needs_gpu("attention_backward", [&] {
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nq, nkv, hd);
  });
  test::expect_needs_gpu("attention_decode", [&] { ops::attention_decode(out1, q1, kc, vc, B, T, nq, nkv, hd); });
  // The positioned forms of context parallelism: the second query at position 1 against both keys.
  Tensor q_one = cu({B, 1, nq * hd}), out_one = cu({B, 1, nq * hd}), lse_one = cu({B, nq, 1});
  test::expect_needs_gpu("attention_at_forward", [&] {
    ops::attention_at_forward(out_one, lse_one, q_one, k, v, B, 1, T, 1, nq, nkv, hd);
  });
  test::expect_needs_gpu("attention_at_backward", [&] {
    ops::attention_at_backward(q_one, dk, dv, out_one, q_one, k, v, out_one, lse_one, B, 1, T, 1, nq, nkv, hd);
  });
}

}  // namespace
}  // namespace zaya
