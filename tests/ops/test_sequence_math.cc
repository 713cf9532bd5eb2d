// The per-element math that the CUDA sequence kernels run (ops/sequence_math.h), run here on the
// host: against the CPU ops bit for bit where the CUDA kernels promise the CPU's bits (RoPE, the mean
// skip), and against float64 formulas elsewhere, so that what a GPU computes is tested on machines
// without one.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "ops/gradcheck.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/rope.h"
#include "zaya/ops/sequence_math.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(SequenceMath, RopeRotateIsBitwiseTheCpuOp) {
  const int64_t B = 2, T = 33, H = 3, hd = 24, offset = 7;
  const RopeTable t = make_rope_table(hd, 0.5, 1e4, T + offset);
  const int64_t half = t.rot / 2;
  Tensor x = random_tensor({B, T, H, hd}, 1, 3.0f);
  for (float sign : {1.0f, -1.0f}) {
    Tensor y = Tensor::empty(x.shape(), DType::f32), mine = x.clone();
    if (sign > 0) rope_forward(y, x, t, B, T, H, hd, offset);
    else rope_backward(y, x, t, B, T, H, hd, offset);
    const float* xp = x.data<float>();
    float* mp = mine.data<float>();
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t pos = bt % T + offset;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < half; ++j) {
          const int64_t o = (bt * H + h) * hd;
          const math::Pair r = math::rope_rotate(xp[o + j], xp[o + j + half], t.cos.data<float>()[pos * half + j],
                                                 t.sin.data<float>()[pos * half + j], sign);
          mp[o + j] = r.lo;
          mp[o + j + half] = r.hi;
        }
    }
    EXPECT_TRUE(same_bits(mine, y)) << "sign " << sign;
  }
}

TEST(SequenceMath, MeanSkipIsBitwiseTheCpuOp) {
  const CcaDims d{6, 2, 5};
  const int64_t N = 9, C = d.channels(), rq = d.nq * d.hd, rk = d.nkv * d.hd, G = d.nq / d.nkv;
  const float inv_g = 1.0f / static_cast<float>(G);
  Tensor conv = random_tensor({N, C}, 1), qt = random_tensor({N, rq}, 2), kt = random_tensor({N, rk}, 3);
  Tensor q = Tensor::empty({N, rq}, DType::f32), k = Tensor::empty({N, rk}, DType::f32);
  mean_skip_forward(q, k, conv, qt, kt, N, d);
  Tensor dq = random_tensor({N, rq}, 4), dk = random_tensor({N, rk}, 5);
  Tensor dconv = Tensor::empty({N, C}, DType::f32), dqt = Tensor::empty({N, rq}, DType::f32),
         dkt = Tensor::empty({N, rk}, DType::f32);
  mean_skip_backward(dconv, dqt, dkt, dq, dk, N, d);
  Tensor mq = q.clone(), mk = k.clone(), mdqt = dqt.clone(), mdkt = dkt.clone();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < d.nkv; ++j)
      for (int64_t e = 0; e < d.hd; ++e) {
        const float kj = kt.data<float>()[n * rk + j * d.hd + e], dkj = dk.data<float>()[n * rk + j * d.hd + e];
        float m_sum = 0.0f, dm_sum = 0.0f;
        for (int64_t h = j * G; h < (j + 1) * G; ++h) {
          const float m = math::mean_skip_m(qt.data<float>()[n * rq + h * d.hd + e], kj);
          mq.data<float>()[n * rq + h * d.hd + e] = conv.data<float>()[n * C + h * d.hd + e] + m;
          m_sum += m;
          const float dm = math::mean_skip_dm(dq.data<float>()[n * rq + h * d.hd + e], dkj, inv_g);
          mdqt.data<float>()[n * rq + h * d.hd + e] = 0.5f * dm;
          dm_sum += dm;
        }
        mk.data<float>()[n * rk + j * d.hd + e] =
            math::mean_skip_key(conv.data<float>()[n * C + (d.nq + j) * d.hd + e], m_sum, inv_g);
        mdkt.data<float>()[n * rk + j * d.hd + e] = dm_sum * 0.5f;
      }
  EXPECT_TRUE(same_bits(mq, q));
  EXPECT_TRUE(same_bits(mk, k));
  EXPECT_TRUE(same_bits(mdqt, dqt));
  EXPECT_TRUE(same_bits(mdkt, dkt));
}

// The remaining functions against float64: each is a few float operations, ≤ ½ ulp each, plus
// expf's ≤ 2 ulp: 1e-6 relative to the terms' size.
TEST(SequenceMath, ConvNormAndAttentionTermsMatchFloat64) {
  const double tol = 1e-6;
  Tensor r = random_tensor({64, 6}, 7, 2.0f);
  for (int64_t i = 0; i < 64; ++i) {
    const float* a = r.data<float>() + 6 * i;
    const double size = std::fabs(a[0] * a[2]) + std::fabs(a[1] * a[3]) + std::fabs(a[4]);
    EXPECT_NEAR(math::depthwise_slot(a[0], a[1], a[2], a[3], a[4]),
                double(a[4]) + double(a[2]) * a[0] + double(a[3]) * a[1], tol * size);
    EXPECT_NEAR(math::depthwise_input_grad(a[0], a[1], a[2], a[3]), double(a[0]) * a[2] + double(a[1]) * a[3],
                tol * (std::fabs(a[0] * a[2]) + std::fabs(a[1] * a[3])));
    // QK norm of a row with norm |a[0]|·10 and a projection from a[1]: dx = (√hd/n)(τ·dy − x·proj).
    const double n = std::fabs(a[0]) * 10, sqrt_hd = std::sqrt(128.0), proj = double(a[5]) * a[1] / (n * n);
    const float pf = math::qk_norm_proj(a[5], a[1], static_cast<float>(n));
    EXPECT_NEAR(pf, proj, tol * std::fabs(proj));
    EXPECT_NEAR(math::qk_norm_input_grad(a[2], a[3], a[5], static_cast<float>(n), pf, static_cast<float>(sqrt_hd)),
                sqrt_hd / n * (double(a[5]) * a[3] - double(a[2]) * proj),
                tol * sqrt_hd / n * (std::fabs(a[5] * a[3]) + std::fabs(a[2] * proj)));
    EXPECT_NEAR(math::qk_norm_scale(static_cast<float>(n), static_cast<float>(sqrt_hd)), sqrt_hd / n,
                tol * sqrt_hd / n);
    const double p = std::exp(double(a[0]) * 0.125 - std::fabs(a[1]) * 3);
    EXPECT_NEAR(math::attention_prob(a[0], 0.125f, std::fabs(a[1]) * 3), p, 3 * tol * p);
    EXPECT_NEAR(math::attention_dscore(0.25f, a[2], a[3]), 0.25 * (double(a[2]) - a[3]),
                tol * (std::fabs(a[2]) + std::fabs(a[3])));
  }
  // Below ε the norm's scale is the constant √hd/ε, and the gradient passes dy through scaled.
  EXPECT_EQ(math::qk_norm_scale(0.0f, 2.0f), 2.0f / FLT_EPSILON);
  EXPECT_EQ(math::qk_norm_input_grad(0.0f, 3.0f, 0.5f, 0.0f, 0.0f, 2.0f), (2.0f / FLT_EPSILON * 0.5f) * 3.0f);
}

}  // namespace
}  // namespace zaya::ops
