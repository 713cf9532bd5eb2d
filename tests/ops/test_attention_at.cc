// attention_at_forward / attention_at_backward (queries at an offset against a key prefix, what a
// context-parallel rank runs per chunk), on both CPU paths (offsets on the 64-row tiles and off
// them), against the full causal attention on the whole sequence:
// the chunk's rows of the output, its lse, and — with the output gradient nonzero only on the
// chunk — dq of the chunk and dk, dv of the prefix. Also add_block, which the halo gradients use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/copy.h"

namespace zaya {
namespace {

Tensor f32_empty(std::initializer_list<int64_t> dims) { return Tensor::empty(Shape(dims), DType::f32); }
Tensor f32_zeros(std::initializer_list<int64_t> dims) { return Tensor::zeros(Shape(dims), DType::f32); }

float max_abs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}
// max |a − b| over max |b|: both kernels are fp32 with different summation orders (the tiled
// kernel's tile products against dot products along hd), so they agree to a few ulps of the
// largest element, far inside 1e-5.
float rel(const Tensor& a, const Tensor& b) {
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return d / std::max(max_abs(b), 1e-30f);
}

struct Case {
  int64_t T, nq, nkv, hd, q_pos, Tq;
};

class AttentionAt : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionAt, MatchesTheFullCausalAttentionOnTheChunk) {
  const Case c = GetParam();
  const int64_t rq = c.nq * c.hd, rk = c.nkv * c.hd, Tk = c.q_pos + c.Tq;
  Tensor q = f32_empty({c.T, rq}), k = f32_empty({c.T, rk}), v = f32_empty({c.T, rk});
  Tensor dout = f32_zeros({c.T, rq});
  fill_normal(q, 1, 0, 0.0f, 1.5f);
  fill_normal(k, 2, 0, 0.0f, 1.5f);
  fill_normal(v, 3, 0, 0.0f, 1.0f);
  Tensor chunk_dout = dout.slice(c.q_pos, Tk);
  fill_normal(chunk_dout, 4, 0, 0.0f, 1.0f);
  // The full sequence.
  Tensor out = f32_empty({c.T, rq}), lse = f32_empty({1, c.nq, c.T});
  Tensor dq = f32_empty({c.T, rq}), dk = f32_empty({c.T, rk}), dv = f32_empty({c.T, rk});
  ops::attention_forward(out, lse, q, k, v, 1, c.T, c.nq, c.nkv, c.hd);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, 1, c.T, c.nq, c.nkv, c.hd);
  // The chunk against its prefix; dk, dv accumulate onto a nonzero start.
  Tensor o2 = f32_empty({c.Tq, rq}), l2 = f32_empty({1, c.nq, c.Tq}), dq2 = f32_empty({c.Tq, rq});
  Tensor dk2 = f32_empty({Tk, rk}), dv2 = f32_empty({Tk, rk});
  dk2.fill_(0.5);
  dv2.fill_(-0.25);
  ops::attention_at_forward(o2, l2, q.slice(c.q_pos, Tk), k.slice(0, Tk), v.slice(0, Tk), 1, c.Tq, Tk,
                            c.q_pos, c.nq, c.nkv, c.hd);
  ops::attention_at_backward(dq2, dk2, dv2, chunk_dout, q.slice(c.q_pos, Tk), k.slice(0, Tk), v.slice(0, Tk),
                             o2, l2, 1, c.Tq, Tk, c.q_pos, c.nq, c.nkv, c.hd);
  EXPECT_LT(rel(o2, out.slice(c.q_pos, Tk)), 1e-6f);
  Tensor lse_chunk = f32_empty({1, c.nq, c.Tq});
  for (int64_t h = 0; h < c.nq; ++h)
    for (int64_t i = 0; i < c.Tq; ++i)
      lse_chunk.data<float>()[h * c.Tq + i] = lse.data<float>()[h * c.T + c.q_pos + i];
  EXPECT_LT(rel(l2, lse_chunk), 1e-6f);
  EXPECT_LT(rel(dq2, dq.slice(c.q_pos, Tk)), 1e-5f);
  for (int64_t i = 0; i < dk2.numel(); ++i) {
    dk2.data<float>()[i] -= 0.5f;
    dv2.data<float>()[i] += 0.25f;
  }
  EXPECT_LT(rel(dk2, dk.slice(0, Tk)), 1e-5f);
  EXPECT_LT(rel(dv2, dv.slice(0, Tk)), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionAt,
                         ::testing::Values(Case{16, 2, 1, 8, 0, 16}, Case{16, 2, 1, 8, 12, 4},
                                           Case{24, 4, 2, 16, 5, 1}, Case{200, 4, 2, 16, 70, 67},
                                           Case{40, 2, 2, 8, 0, 3},
                                           // offsets on the 64-row tiles: the tiled kernel
                                           Case{200, 4, 2, 16, 64, 100}, Case{300, 2, 1, 64, 128, 172},
                                           Case{256, 4, 2, 64, 192, 64}, Case{130, 2, 1, 16, 64, 1}));

TEST(AttentionAt, RefusesQueriesPastTheKeys) {
  Tensor q = f32_zeros({4, 8}), k = f32_zeros({5, 8}), o = f32_zeros({4, 8}), l = f32_zeros({1, 1, 4});
  try {
    ops::attention_at_forward(o, l, q, k, k, 1, 4, 5, 2, 1, 1, 8);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Tk = 5"), std::string::npos) << e.what();
  }
}

TEST(AddBlock, AddsTheBlockAndChecksItsBounds) {
  Tensor dst = f32_zeros({3, 4}), src = f32_empty({2, 5});
  for (int64_t i = 0; i < 10; ++i) src.data<float>()[i] = static_cast<float>(i);
  dst.fill_(1.0);
  ops::add_block(dst, 1, 2, src, 0, 3, 2, 2);  // dst[1:3, 2:4] += src[0:2, 3:5]
  const std::vector<float> want{1, 1, 1, 1, 1, 1, 4, 5, 1, 1, 9, 10};
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(dst.data<float>()[i], want[static_cast<size_t>(i)]) << i;
  EXPECT_THROW(ops::add_block(dst, 2, 0, src, 0, 0, 2, 2), Error);
}

}  // namespace
}  // namespace zaya
