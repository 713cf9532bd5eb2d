// The split form of a context-parallel chunk's attention (ops/attention.h: attention_prefix_* and
// attention_merge), on the CPU:
//   - attention_merge against a float64 evaluation of the same formula;
//   - attention_prefix_forward against float64 attention in which every query sees every key;
//   - the chunk's own keys (attention_at_forward at q_pos 0) merged with the keys before it
//     (attention_prefix_forward) against attention_at_forward over all of them, and the two
//     backwards (dq, dk, dv accumulated) against attention_at_backward's, on both CPU paths (key
//     counts on the 64-row tiles: the tiled kernel; off them: the row-by-row kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/ops/attention.h"

namespace zaya {
namespace {

Tensor f32_empty(std::initializer_list<int64_t> dims) { return Tensor::empty(Shape(dims), DType::f32); }

float max_abs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}
// max |a − b| over max |b|.
float rel(const Tensor& a, const Tensor& b) {
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return d / std::max(max_abs(b), 1e-30f);
}
double rel64(const Tensor& a, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::fabs(a.data<float>()[i] - want[static_cast<size_t>(i)]));
    m = std::max(m, std::fabs(want[static_cast<size_t>(i)]));
  }
  return d / std::max(m, 1e-300);
}

// The merge is a handful of float ops per element (two exps, a log, two products and a sum), so it
// is within a few ulps of float64: 1e-6 of the largest element.
TEST(AttentionMerge, MatchesFloat64) {
  const int64_t B = 2, T = 5, nq = 3, hd = 7;
  Tensor oa = f32_empty({B, T, nq, hd}), ob = f32_empty({B, T, nq, hd}), la = f32_empty({B, nq, T}),
         lb = f32_empty({B, nq, T});
  fill_normal(oa, 1, 0, 0.0f, 1.0f);
  fill_normal(ob, 2, 0, 0.0f, 1.0f);
  fill_normal(la, 3, 0, 2.0f, 4.0f);  // log-sum-exps far apart and close
  fill_normal(lb, 4, 0, 2.0f, 4.0f);
  la.data<float>()[3] = -std::numeric_limits<float>::infinity();  // a part with no keys: weight 0
  std::vector<double> want_o(static_cast<size_t>(oa.numel())), want_l(static_cast<size_t>(la.numel()));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < nq; ++h) {
        const int64_t l = (b * nq + h) * T + i, row = (b * T + i) * nq + h;
        const double a = la.data<float>()[l], c = lb.data<float>()[l], m = std::max(a, c);
        const double L = m + std::log(std::exp(a - m) + std::exp(c - m));
        want_l[static_cast<size_t>(l)] = L;
        for (int64_t d = 0; d < hd; ++d)
          want_o[static_cast<size_t>(row * hd + d)] = std::exp(a - L) * oa.data<float>()[row * hd + d] +
                                                      std::exp(c - L) * ob.data<float>()[row * hd + d];
      }
  ops::attention_merge(oa, la, ob, lb, B, T, nq, hd);
  EXPECT_LT(rel64(oa, want_o), 1e-6);
  EXPECT_LT(rel64(la, want_l), 1e-6);
}

TEST(AttentionMerge, RefusesMismatchedShapes) {
  Tensor o = f32_empty({1, 4, 2, 8}), l = f32_empty({1, 2, 4}), l3 = f32_empty({1, 2, 3});
  EXPECT_THROW(ops::attention_merge(o, l, o, l3, 1, 4, 2, 8), Error);
}

struct Split {
  int64_t Tq, Tk, nq, nkv, hd;  // a chunk of Tq queries after Tk keys
};

class AttentionPrefix : public ::testing::TestWithParam<Split> {};

// Every query against every key, in float64: within 1e-6 of the largest output (fp32 sums of up to
// Tk = 192 terms, each a few ulps off).
TEST_P(AttentionPrefix, ForwardMatchesFloat64AttentionWithoutAMask) {
  const Split c = GetParam();
  const int64_t rq = c.nq * c.hd, rk = c.nkv * c.hd, G = c.nq / c.nkv;
  Tensor q = f32_empty({c.Tq, rq}), k = f32_empty({c.Tk, rk}), v = f32_empty({c.Tk, rk});
  fill_normal(q, 11, 0, 0.0f, 1.5f);
  fill_normal(k, 12, 0, 0.0f, 1.5f);
  fill_normal(v, 13, 0, 0.0f, 1.0f);
  Tensor out = f32_empty({c.Tq, rq}), lse = f32_empty({1, c.nq, c.Tq});
  ops::attention_prefix_forward(out, lse, q, k, v, 1, c.Tq, c.Tk, c.nq, c.nkv, c.hd);
  std::vector<double> want_o(static_cast<size_t>(out.numel())), want_l(static_cast<size_t>(lse.numel()));
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  for (int64_t h = 0; h < c.nq; ++h)
    for (int64_t i = 0; i < c.Tq; ++i) {
      std::vector<double> s(static_cast<size_t>(c.Tk));
      double m = -INFINITY;
      for (int64_t j = 0; j < c.Tk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < c.hd; ++d)
          dot += static_cast<double>(q.data<float>()[i * rq + h * c.hd + d]) * k.data<float>()[j * rk + (h / G) * c.hd + d];
        s[static_cast<size_t>(j)] = dot * scale;
        m = std::max(m, s[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      want_l[static_cast<size_t>(h * c.Tq + i)] = m + std::log(sum);
      for (int64_t d = 0; d < c.hd; ++d) {
        double o = 0;
        for (int64_t j = 0; j < c.Tk; ++j) o += s[static_cast<size_t>(j)] * v.data<float>()[j * rk + (h / G) * c.hd + d];
        want_o[static_cast<size_t>(i * rq + h * c.hd + d)] = o / sum;
      }
    }
  EXPECT_LT(rel64(out, want_o), 1e-6);
  EXPECT_LT(rel64(lse, want_l), 1e-6);
}

// The split (own keys causal, keys before all visible, merged) against attention_at over all of
// them: forward within 1e-6 (the merge regroups the softmax sums), the gradients within 1e-5 (as
// test_attention_at.cc's: dS subtracts nearly equal sums). dk, dv, dq accumulate onto start values.
TEST_P(AttentionPrefix, SplitAtTheChunkMatchesTheWholeChunk) {
  const Split c = GetParam();
  const int64_t rq = c.nq * c.hd, rk = c.nkv * c.hd, N = c.Tk + c.Tq;
  Tensor q = f32_empty({c.Tq, rq}), k = f32_empty({N, rk}), v = f32_empty({N, rk}), dout = f32_empty({c.Tq, rq});
  fill_normal(q, 1, 0, 0.0f, 1.5f);
  fill_normal(k, 2, 0, 0.0f, 1.5f);
  fill_normal(v, 3, 0, 0.0f, 1.0f);
  fill_normal(dout, 4, 0, 0.0f, 1.0f);
  // Whole: the chunk at position Tk against keys [0, Tk + Tq).
  Tensor out = f32_empty({c.Tq, rq}), lse = f32_empty({1, c.nq, c.Tq}), dq = f32_empty({c.Tq, rq});
  Tensor dk = Tensor::zeros(Shape{N, rk}, DType::f32), dv = Tensor::zeros(Shape{N, rk}, DType::f32);
  ops::attention_at_forward(out, lse, q, k, v, 1, c.Tq, N, c.Tk, c.nq, c.nkv, c.hd);
  ops::attention_at_backward(dq, dk, dv, dout, q, k, v, out, lse, 1, c.Tq, N, c.Tk, c.nq, c.nkv, c.hd);
  // Split.
  const Tensor k_own = k.slice(c.Tk, N), v_own = v.slice(c.Tk, N), k_pre = k.slice(0, c.Tk), v_pre = v.slice(0, c.Tk);
  Tensor o2 = f32_empty({c.Tq, rq}), l2 = f32_empty({1, c.nq, c.Tq}), ob = f32_empty({c.Tq, rq}),
         lb = f32_empty({1, c.nq, c.Tq});
  ops::attention_at_forward(o2, l2, q, k_own, v_own, 1, c.Tq, c.Tq, 0, c.nq, c.nkv, c.hd);
  ops::attention_prefix_forward(ob, lb, q, k_pre, v_pre, 1, c.Tq, c.Tk, c.nq, c.nkv, c.hd);
  ops::attention_merge(o2, l2, ob, lb, 1, c.Tq, c.nq, c.hd);
  EXPECT_LT(rel(o2, out), 1e-6f);
  EXPECT_LT(rel(l2, lse), 1e-6f);
  Tensor dq2 = f32_empty({c.Tq, rq}), dk2 = f32_empty({N, rk}), dv2 = f32_empty({N, rk});
  dk2.fill_(0.5);
  dv2.fill_(-0.25);
  ops::attention_at_backward(dq2, dk2.slice(c.Tk, N), dv2.slice(c.Tk, N), dout, q, k_own, v_own, o2, l2, 1, c.Tq,
                             c.Tq, 0, c.nq, c.nkv, c.hd);
  ops::attention_prefix_backward(dq2, dk2.slice(0, c.Tk), dv2.slice(0, c.Tk), dout, q, k_pre, v_pre, o2, l2, 1, c.Tq,
                                 c.Tk, c.nq, c.nkv, c.hd);
  for (int64_t i = 0; i < dk2.numel(); ++i) {
    dk2.data<float>()[i] -= 0.5f;
    dv2.data<float>()[i] += 0.25f;
  }
  EXPECT_LT(rel(dq2, dq), 1e-5f);
  EXPECT_LT(rel(dk2, dk), 1e-5f);
  EXPECT_LT(rel(dv2, dv), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionPrefix,
                         ::testing::Values(Split{4, 12, 2, 1, 8}, Split{1, 5, 4, 2, 16}, Split{67, 70, 4, 2, 16},
                                           // key counts on the 64-row tiles: the tiled kernel
                                           Split{64, 64, 4, 2, 16}, Split{100, 192, 2, 1, 64},
                                           Split{1, 128, 4, 1, 32}, Split{130, 320, 2, 2, 8}));

}  // namespace
}  // namespace zaya
