// CCA block ops against float64 references written literally after transformers' ZayaCCAProjection
// and ZayaQKNorm (pad twice on the left, depthwise conv, grouped conv; mean skip; value shift; L2
// norm with temperature), gradients by central differences, decode steps against the full forward,
// determinism across thread counts.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ops/device_dispatch.h"
#include "gradcheck.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cca.h"

namespace zaya {
namespace {

using test::rel_error;
using test::to_f64;
using V = std::vector<double>;

// HF: qk = pad(z, (2, 0)); qk = conv_depthwise(qk) (T+1 slots); qk = conv_grouped(qk) (T outputs).
V conv_ref(const V& z, const V& dw, const V& db, const V& gw, const V& gb, int64_t B, int64_t T, int64_t heads,
           int64_t hd) {
  const int64_t C = heads * hd;
  V out(B * T * C);
  for (int64_t b = 0; b < B; ++b) {
    auto zp = [&](int64_t s, int64_t c) { return s < 2 ? 0.0 : z[(b * T + s - 2) * C + c]; };  // padded input
    V d((T + 1) * C);
    for (int64_t s = 0; s <= T; ++s)
      for (int64_t c = 0; c < C; ++c) d[s * C + c] = db[c] + dw[2 * c] * zp(s, c) + dw[2 * c + 1] * zp(s + 1, c);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < C; ++o) {
        const int64_t g = o / hd;
        double acc = gb[o];
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t kk = 0; kk < 2; ++kk) acc += gw[(o * hd + i) * 2 + kk] * d[(t + kk) * C + g * hd + i];
        out[(b * T + t) * C + o] = acc;
      }
  }
  return out;
}

struct ConvCase {
  int64_t B, T, nq, nkv, hd;
};

struct ConvSetup {
  ops::CcaDims dims;
  Tensor z, dw, db, gw, gb, g;
  ops::CcaConvWeights w() const { return {dw, db, gw, gb}; }
};

ConvSetup conv_setup(const ConvCase& c, uint64_t seed) {
  ConvSetup s;
  s.dims = {c.nq, c.nkv, c.hd};
  const int64_t C = s.dims.channels();
  s.z = test::random_tensor(Shape{c.B, c.T, C}, seed);
  s.dw = test::random_tensor(Shape{C, 1, 2}, seed + 1, 0.5f);
  s.db = test::random_tensor(Shape{C}, seed + 2, 0.5f);
  s.gw = test::random_tensor(Shape{C, c.hd, 2}, seed + 3, 0.3f);
  s.gb = test::random_tensor(Shape{C}, seed + 4, 0.5f);
  s.g = test::random_tensor(Shape{c.B, c.T, C}, seed + 5);
  return s;
}

class CcaConvShapes : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CcaConvShapes, ForwardMatchesFloat64) {
  const ConvCase c = GetParam();
  ConvSetup s = conv_setup(c, 10 + c.T);
  Tensor out = Tensor::empty(s.z.shape(), DType::f32);
  ops::cca_conv_forward(out, s.z, s.w(), c.B, c.T, s.dims);
  V ref = conv_ref(to_f64(s.z), to_f64(s.dw), to_f64(s.db), to_f64(s.gw), to_f64(s.gb), c.B, c.T, s.dims.heads(),
                   c.hd);
  EXPECT_LT(rel_error(out, ref), 1e-6);  // fp32 dots of length 2·hd: a few ulps
}

INSTANTIATE_TEST_SUITE_P(Shapes, CcaConvShapes,
                         ::testing::Values(ConvCase{1, 1, 4, 2, 16}, ConvCase{2, 5, 2, 2, 32},
                                           ConvCase{3, 67, 4, 1, 16}, ConvCase{1, 5, 4, 2, 64},
                                           // hd 24 and 12: a dot of 2·hd is not whole vectors, a head
                                           // not whole 16-output groups (the kernel's masked paths)
                                           ConvCase{2, 7, 2, 1, 24}, ConvCase{1, 9, 4, 2, 12}));

TEST(CcaConv, FirstStepSeesTheDepthwiseBiasOfThePaddedSlot) {
  // With z = 0 everywhere, every depthwise slot is its bias, so out_t = gb + Σ_i (gw0 + gw1)·db for
  // all t — including t = 0, which reads the padded slot (the "pad once" rule).
  ConvSetup s = conv_setup({1, 3, 2, 1, 16}, 3);
  s.z.zero_();
  Tensor out = Tensor::empty(s.z.shape(), DType::f32);
  ops::cca_conv_forward(out, s.z, s.w(), 1, 3, s.dims);
  const int64_t C = s.dims.channels(), hd = 16;
  for (int64_t o = 0; o < C; ++o) {
    double want = s.gb.data<float>()[o];
    for (int64_t i = 0; i < hd; ++i)
      want += (s.gw.data<float>()[(o * hd + i) * 2] + s.gw.data<float>()[(o * hd + i) * 2 + 1]) *
              s.db.data<float>()[o / hd * hd + i];
    for (int64_t t = 0; t < 3; ++t) EXPECT_NEAR(out.data<float>()[t * C + o], want, 1e-5);  // fp32 dot
  }
}

TEST(CcaConv, BackwardMatchesFiniteDifferences) {
  for (ConvCase c : {ConvCase{2, 5, 4, 2, 16}, ConvCase{1, 1, 2, 2, 16}, ConvCase{1, 4, 4, 1, 16},
                     ConvCase{2, 3, 2, 1, 12}}) {
    ConvSetup s = conv_setup(c, 20 + c.T);
    const int64_t C = s.dims.channels(), heads = s.dims.heads();
    // Parameter grads accumulate: start them at a known non-zero value and subtract it afterwards.
    ops::CcaConvWeights gr{Tensor::empty(s.dw.shape(), DType::f32), Tensor::empty(s.db.shape(), DType::f32),
                           Tensor::empty(s.gw.shape(), DType::f32), Tensor::empty(s.gb.shape(), DType::f32)};
    for (Tensor* t : {&gr.dw_weight, &gr.dw_bias, &gr.gw_weight, &gr.gw_bias}) t->fill_(0.25);
    Tensor dz = Tensor::empty(s.z.shape(), DType::f32);
    dz.fill_(7.0);  // written, not accumulated: stale contents must vanish
    ops::cca_conv_backward(dz, gr, s.g, s.z, s.w(), c.B, c.T, s.dims);
    V z = to_f64(s.z), dw = to_f64(s.dw), db = to_f64(s.db), gw = to_f64(s.gw), gb = to_f64(s.gb), g = to_f64(s.g);
    auto L = [&](const V& z_, const V& dw_, const V& db_, const V& gw_, const V& gb_) {
      return test::dot(g, conv_ref(z_, dw_, db_, gw_, gb_, c.B, c.T, heads, c.hd));
    };
    auto minus = [](const Tensor& t, double v) {
      V x = to_f64(t);
      for (double& e : x) e -= v;
      return x;
    };
    using test::numerical_gradient;
    // The op is linear in each argument separately, so central differences are exact up to double
    // rounding; the 1e-5 bound covers fp32 accumulation over B·T terms.
    EXPECT_LT(rel_error(dz, numerical_gradient([&](const V& x) { return L(x, dw, db, gw, gb); }, z)), 1e-5);
    EXPECT_LT(rel_error(minus(gr.dw_weight, 0.25), numerical_gradient([&](const V& x) { return L(z, x, db, gw, gb); }, dw)), 1e-5);
    EXPECT_LT(rel_error(minus(gr.dw_bias, 0.25), numerical_gradient([&](const V& x) { return L(z, dw, x, gw, gb); }, db)), 1e-5);
    EXPECT_LT(rel_error(minus(gr.gw_weight, 0.25), numerical_gradient([&](const V& x) { return L(z, dw, db, x, gb); }, gw)), 1e-5);
    EXPECT_LT(rel_error(minus(gr.gw_bias, 0.25), numerical_gradient([&](const V& x) { return L(z, dw, db, gw, x); }, gb)), 1e-5);
    (void)C;
  }
}

// accumulate_dz adds the gradient to what dz holds (the model puts the mean skip's part there
// first): exactly prior + the written gradient, element by element, since that is one float add.
TEST(CcaConv, BackwardAccumulateDzAddsToWhatIsThere) {
  for (ConvCase c : {ConvCase{2, 5, 4, 2, 16}, ConvCase{1, 70, 2, 1, 24}}) {
    ConvSetup s = conv_setup(c, 40 + c.T);
    auto grads = [&] {
      ops::CcaConvWeights g{Tensor::zeros(s.dw.shape(), DType::f32), Tensor::zeros(s.db.shape(), DType::f32),
                            Tensor::zeros(s.gw.shape(), DType::f32), Tensor::zeros(s.gb.shape(), DType::f32)};
      return g;
    };
    ops::CcaConvWeights g1 = grads(), g2 = grads();
    Tensor written = Tensor::empty(s.z.shape(), DType::f32);
    ops::cca_conv_backward(written, g1, s.g, s.z, s.w(), c.B, c.T, s.dims);
    Tensor prior = test::random_tensor(s.z.shape(), 77), acc = prior.clone();
    ops::cca_conv_backward(acc, g2, s.g, s.z, s.w(), c.B, c.T, s.dims, /*accumulate_dz=*/true);
    const float *w = written.data<float>(), *p = prior.data<float>(), *a = acc.data<float>();
    for (int64_t i = 0; i < acc.numel(); ++i) ASSERT_EQ(a[i], p[i] + w[i]) << "element " << i;
    // The weight gradients do not depend on the flag.
    for (auto [x, y] : {std::pair{&g1.dw_weight, &g2.dw_weight}, {&g1.gw_weight, &g2.gw_weight}})
      for (int64_t i = 0; i < x->numel(); ++i) ASSERT_EQ(x->data<float>()[i], y->data<float>()[i]);
  }
}

TEST(CcaConv, DecodeEqualsFullForwardAtEveryPosition) {
  // hd 80: two passes of 64 outputs in the AVX-512 forward, the second partial.
  for (const ConvCase c : {ConvCase{2, 9, 4, 2, 32}, ConvCase{2, 70, 2, 1, 24}, ConvCase{1, 6, 4, 2, 12},
                           ConvCase{1, 7, 2, 1, 80}}) {
  ConvSetup s = conv_setup(c, 31);
  const int64_t C = s.dims.channels();
  Tensor out = Tensor::empty(s.z.shape(), DType::f32);
  ops::cca_conv_forward(out, s.z, s.w(), c.B, c.T, s.dims);
  Tensor state = Tensor::zeros(Shape{c.B, 2, C}, DType::f32);
  Tensor zt = Tensor::empty(Shape{c.B, C}, DType::f32), ot = zt.clone();
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t b = 0; b < c.B; ++b)
      std::memcpy(zt.data<float>() + b * C, s.z.data<float>() + (b * c.T + t) * C, C * 4);
    ops::cca_conv_decode(ot, state, zt, s.w(), c.B, s.dims);
    // Identical arithmetic in the identical order: bitwise equal.
    for (int64_t b = 0; b < c.B; ++b)
      ASSERT_EQ(std::memcmp(ot.data<float>() + b * C, out.data<float>() + (b * c.T + t) * C, C * 4), 0)
          << "hd=" << c.hd << " t=" << t << " b=" << b;
  }
  }
}

TEST(CcaConv, BackwardBitwiseDeterministicAcrossThreads) {
  const ConvCase c{2, 67, 4, 2, 32};
  ConvSetup s = conv_setup(c, 41);
  auto run = [&](int threads) {
    set_num_threads(threads);
    ops::CcaConvWeights gr{Tensor::zeros(s.dw.shape(), DType::f32), Tensor::zeros(s.db.shape(), DType::f32),
                           Tensor::zeros(s.gw.shape(), DType::f32), Tensor::zeros(s.gb.shape(), DType::f32)};
    Tensor dz = Tensor::empty(s.z.shape(), DType::f32), out = dz.clone();
    ops::cca_conv_forward(out, s.z, s.w(), c.B, c.T, s.dims);
    ops::cca_conv_backward(dz, gr, s.g, s.z, s.w(), c.B, c.T, s.dims);
    return std::vector<Tensor>{out, dz, gr.dw_weight, gr.dw_bias, gr.gw_weight, gr.gw_bias};
  };
  const int saved = num_threads();
  auto a = run(1), b = run(2), b2 = run(2);
  set_num_threads(saved);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()), 0) << i;
    EXPECT_EQ(std::memcmp(b[i].raw(), b2[i].raw(), b[i].nbytes()), 0) << i;
  }
}

TEST(CcaConv, RejectsWrongWeightShape) {
  ConvSetup s = conv_setup({1, 3, 2, 1, 16}, 3);
  ops::CcaConvWeights w = s.w();
  w.gw_weight = Tensor::zeros(Shape{48, 1, 2}, DType::f32);
  Tensor out = Tensor::empty(s.z.shape(), DType::f32);
  try {
    ops::cca_conv_forward(out, s.z, w, 1, 3, s.dims);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("conv_qk_grouped.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[48, 16, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find("[48, 1, 2]"), std::string::npos) << m;
  }
}

// ---- mean skip ----

void mean_skip_ref(const V& conv, const V& qt, const V& kt, int64_t N, int64_t nq, int64_t nkv, int64_t hd, V& q,
                   V& k) {
  const int64_t G = nq / nkv, C = (nq + nkv) * hd;
  q.assign(N * nq * hd, 0);
  k.assign(N * nkv * hd, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < nq; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        const int64_t j = h / G;
        double m = 0.5 * (qt[(n * nq + h) * hd + d] + kt[(n * nkv + j) * hd + d]);
        q[(n * nq + h) * hd + d] = conv[n * C + h * hd + d] + m;
        k[(n * nkv + j) * hd + d] += m / G;
      }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t x = 0; x < nkv * hd; ++x) k[n * nkv * hd + x] += conv[n * C + nq * hd + x];
}

TEST(MeanSkip, ForwardAndBackwardMatchFloat64) {
  for (auto [nq, nkv, hd] : {std::tuple<int64_t, int64_t, int64_t>{4, 2, 16}, {2, 2, 32}, {4, 1, 16}}) {
    const int64_t N = 5, C = (nq + nkv) * hd;
    ops::CcaDims dims{nq, nkv, hd};
    Tensor conv = test::random_tensor(Shape{N, C}, 1), qt = test::random_tensor(Shape{N, nq * hd}, 2),
           kt = test::random_tensor(Shape{N, nkv * hd}, 3);
    Tensor q = Tensor::empty(qt.shape(), DType::f32), k = Tensor::empty(kt.shape(), DType::f32);
    ops::mean_skip_forward(q, k, conv, qt, kt, N, dims);
    V rq, rk;
    mean_skip_ref(to_f64(conv), to_f64(qt), to_f64(kt), N, nq, nkv, hd, rq, rk);
    EXPECT_LT(rel_error(q, rq), 1e-7);  // one or two fp32 roundings per element
    EXPECT_LT(rel_error(k, rk), 1e-6);
    Tensor gq = test::random_tensor(q.shape(), 4), gk = test::random_tensor(k.shape(), 5);
    Tensor dconv = Tensor::empty(conv.shape(), DType::f32), dqt = q.clone(), dkt = k.clone();
    ops::mean_skip_backward(dconv, dqt, dkt, gq, gk, N, dims);
    V c64 = to_f64(conv), q64 = to_f64(qt), k64 = to_f64(kt), g1 = to_f64(gq), g2 = to_f64(gk);
    auto L = [&](const V& c, const V& a, const V& b) {
      V x, y;
      mean_skip_ref(c, a, b, N, nq, nkv, hd, x, y);
      return test::dot(g1, x) + test::dot(g2, y);
    };
    // Linear op: central differences exact up to double rounding; fp32 adds ~1e-7.
    EXPECT_LT(rel_error(dconv, test::numerical_gradient([&](const V& x) { return L(x, q64, k64); }, c64)), 1e-6);
    EXPECT_LT(rel_error(dqt, test::numerical_gradient([&](const V& x) { return L(c64, x, k64); }, q64)), 1e-6);
    EXPECT_LT(rel_error(dkt, test::numerical_gradient([&](const V& x) { return L(c64, q64, x); }, k64)), 1e-6);
  }
}

// ---- value shift ----

TEST(ValueShift, ForwardBackwardAndDecode) {
  const int64_t B = 3, T = 5, half = 16;
  Tensor vc = test::random_tensor(Shape{B, T, half}, 1), vd = test::random_tensor(Shape{B, T, half}, 2);
  // The training ops take [vc | vd] rows (one product's output); the decode step takes them apart.
  Tensor vcd = Tensor::empty(Shape{B, T, 2 * half}, DType::f32);
  for (int64_t bt = 0; bt < B * T; ++bt) {
    std::memcpy(vcd.data<float>() + bt * 2 * half, vc.data<float>() + bt * half, half * 4);
    std::memcpy(vcd.data<float>() + bt * 2 * half + half, vd.data<float>() + bt * half, half * 4);
  }
  Tensor v = Tensor::empty(Shape{B, T, 2 * half}, DType::f32);
  ops::value_shift_forward(v, vcd, B, T, half);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t x = 0; x < half; ++x) {
        const float* row = v.data<float>() + (b * T + t) * 2 * half;
        EXPECT_EQ(row[x], vc.data<float>()[(b * T + t) * half + x]);
        EXPECT_EQ(row[half + x], t == 0 ? 0.0f : vd.data<float>()[(b * T + t - 1) * half + x]);
      }
  // Backward is the transpose: ⟨dv, shift(vc, vd)⟩ = ⟨dvc, vc⟩ + ⟨dvd, vd⟩ for all inputs.
  Tensor dv = test::random_tensor(v.shape(), 3), dvcd = vcd.clone();
  dvcd.fill_(9.0);  // written, not accumulated: stale contents must vanish
  ops::value_shift_backward(dvcd, dv, B, T, half);
  double lhs = test::dot(to_f64(dv), to_f64(v));
  double rhs = test::dot(to_f64(dvcd), to_f64(vcd));
  EXPECT_NEAR(lhs, rhs, 1e-9 * std::fabs(lhs) + 1e-9);  // both sides are the same products in double
  for (int64_t b = 0; b < B; ++b)
    for (int64_t x = 0; x < half; ++x) EXPECT_EQ(dvcd.data<float>()[(b * T + T - 1) * 2 * half + half + x], 0.0f);
  // Decode with the previous vd as state reproduces the forward.
  Tensor state = Tensor::zeros(Shape{B, half}, DType::f32), vt = Tensor::empty(Shape{B, 2 * half}, DType::f32);
  Tensor ct = Tensor::empty(Shape{B, half}, DType::f32), dt = ct.clone();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(ct.data<float>() + b * half, vc.data<float>() + (b * T + t) * half, half * 4);
      std::memcpy(dt.data<float>() + b * half, vd.data<float>() + (b * T + t) * half, half * 4);
    }
    ops::value_shift_decode(vt, state, ct, dt, B, half);
    for (int64_t b = 0; b < B; ++b)
      EXPECT_EQ(std::memcmp(vt.data<float>() + b * 2 * half, v.data<float>() + (b * T + t) * 2 * half, 2 * half * 4), 0);
  }
}

// ---- QK norm ----

void qk_norm_ref(const V& q, const V& k, const V& tau, int64_t N, int64_t nq, int64_t nkv, int64_t hd, V& qo, V& ko) {
  qo = q;
  ko = k;
  auto norm = [&](V& x, int64_t off, double t) {
    double ss = 0;
    for (int64_t d = 0; d < hd; ++d) ss += x[off + d] * x[off + d];
    double s = std::sqrt(static_cast<double>(hd)) / std::max(std::sqrt(ss), static_cast<double>(FLT_EPSILON));
    for (int64_t d = 0; d < hd; ++d) x[off + d] *= s * t;
  };
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < nq; ++h) norm(qo, (n * nq + h) * hd, 1.0);
    for (int64_t j = 0; j < nkv; ++j) norm(ko, (n * nkv + j) * hd, tau[j]);
  }
}

TEST(QkNorm, ForwardAndBackwardMatchFloat64) {
  for (auto [nq, nkv, hd] : {std::tuple<int64_t, int64_t, int64_t>{4, 2, 16}, {2, 2, 32}, {4, 1, 64}}) {
    const int64_t N = 7;
    ops::CcaDims dims{nq, nkv, hd};
    Tensor q = test::random_tensor(Shape{N, nq * hd}, 1), k = test::random_tensor(Shape{N, nkv * hd}, 2);
    Tensor tau = test::random_tensor(Shape{nkv}, 3);
    Tensor qo = q.clone(), ko = k.clone();
    ops::qk_norm_forward(qo, ko, q, k, tau, N, dims);
    V rq, rk;
    qk_norm_ref(to_f64(q), to_f64(k), to_f64(tau), N, nq, nkv, hd, rq, rk);
    EXPECT_LT(rel_error(qo, rq), 1e-6);  // fp32 sum of squares, sqrt, divide, multiply
    EXPECT_LT(rel_error(ko, rk), 1e-6);
    Tensor gq = test::random_tensor(q.shape(), 4), gk = test::random_tensor(k.shape(), 5);
    Tensor dq = q.clone(), dk = k.clone(), dtau = Tensor::empty(Shape{nkv}, DType::f32);
    dtau.fill_(0.5);
    ops::qk_norm_backward(dq, dk, dtau, gq, gk, q, k, tau, N, dims);
    V q64 = to_f64(q), k64 = to_f64(k), t64 = to_f64(tau), g1 = to_f64(gq), g2 = to_f64(gk);
    auto L = [&](const V& a, const V& b, const V& t) {
      V x, y;
      qk_norm_ref(a, b, t, N, nq, nkv, hd, x, y);
      return test::dot(g1, x) + test::dot(g2, y);
    };
    V dt = to_f64(dtau);
    for (double& x : dt) x -= 0.5;
    // Smooth op, double FD with h = 1e-6: ~1e-9; fp32 backward: ~1e-6.
    EXPECT_LT(rel_error(dq, test::numerical_gradient([&](const V& x) { return L(x, k64, t64); }, q64)), 1e-5);
    EXPECT_LT(rel_error(dk, test::numerical_gradient([&](const V& x) { return L(q64, x, t64); }, k64)), 1e-5);
    EXPECT_LT(rel_error(dt, test::numerical_gradient([&](const V& x) { return L(q64, k64, x); }, t64)), 1e-5);
  }
}

TEST(QkNorm, TinyVectorsUseTheEpsilonFloor) {
  // ‖x‖ < FLT_EPSILON: the scale is √hd/ε (the reference's clamp_min), not √hd/‖x‖.
  const int64_t hd = 16;
  ops::CcaDims dims{1, 1, hd};
  Tensor q = Tensor::empty(Shape{1, hd}, DType::f32), k = q.clone(), tau = Tensor::empty(Shape{1}, DType::f32);
  q.fill_(1e-9);
  k.fill_(2e-9);
  tau.fill_(1.5);
  Tensor qo = q.clone(), ko = k.clone();
  ops::qk_norm_forward(qo, ko, q, k, tau, 1, dims);
  EXPECT_NEAR(qo.data<float>()[0], 1e-9 * 4.0 / FLT_EPSILON, 1e-6 * 1e-9 * 4.0 / FLT_EPSILON);  // fp32 rounding
  EXPECT_NEAR(ko.data<float>()[0], 2e-9 * 4.0 / FLT_EPSILON * 1.5, 1e-6 * 2e-9 * 4.0 / FLT_EPSILON * 1.5);
}

TEST(QkNorm, BackwardBitwiseDeterministicAcrossThreads) {
  const int64_t N = 700, nq = 4, nkv = 2, hd = 32;  // > 2 chunks of 256 rows
  ops::CcaDims dims{nq, nkv, hd};
  Tensor q = test::random_tensor(Shape{N, nq * hd}, 1), k = test::random_tensor(Shape{N, nkv * hd}, 2);
  Tensor tau = test::random_tensor(Shape{nkv}, 3), gq = test::random_tensor(q.shape(), 4),
         gk = test::random_tensor(k.shape(), 5);
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor dq = q.clone(), dk = k.clone(), dtau = Tensor::zeros(Shape{nkv}, DType::f32);
    ops::qk_norm_backward(dq, dk, dtau, gq, gk, q, k, tau, N, dims);
    return std::vector<Tensor>{dq, dk, dtau};
  };
  const int saved = num_threads();
  auto a = run(1), b = run(2);
  set_num_threads(saved);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()), 0) << i;
}

// The fused q/k path must be the separate ops in turn, bit for bit (the model runs the fused one,
// the op tests above check the separate ones against float64). Partial RoPE (rot < hd), two batch
// rows (positions restart), N past 256 rows (dτ's chunks), 1 and 2 threads. Outputs start as NaN:
// every element must be written.
TEST(CcaQk, FusedEqualsTheOpsInTurnBitwise) {
  for (auto [nq, nkv, hd, rot_frac] : {std::tuple<int64_t, int64_t, int64_t, double>{4, 2, 16, 0.5}, {2, 2, 32, 1.0},
                                       {4, 1, 64, 0.25}}) {
    const int64_t B = 2, T = 150, N = B * T, rq = nq * hd, rk = nkv * hd, C = rq + rk;
    ops::CcaDims dims{nq, nkv, hd};
    const ops::RopeTable rope = ops::make_rope_table(hd, rot_frac, 10000.0, T);
    Tensor conv = test::random_tensor(Shape{N, C}, 1), z = test::random_tensor(Shape{N, C}, 2),
           tau = test::random_tensor(Shape{nkv}, 4);
    Tensor gq = test::random_tensor(Shape{N, rq}, 5), gk = test::random_tensor(Shape{N, rk}, 6);
    auto nan_tensor = [](Shape sh) {
      Tensor t = Tensor::empty(sh, DType::f32);
      t.fill_(std::nan(""));
      return t;
    };
    // z's rows are [q̃ | k̃]: the separate ops take them as two tensors.
    Tensor qt = nan_tensor(Shape{N, rq}), kt = nan_tensor(Shape{N, rk});
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(qt.data<float>() + n * rq, z.data<float>() + n * C, rq * 4);
      std::memcpy(kt.data<float>() + n * rk, z.data<float>() + n * C + rq, rk * 4);
    }
    // The ops in turn, as the model ran them before.
    Tensor qpre = nan_tensor(Shape{N, rq}), kpre = nan_tensor(Shape{N, rk}), qr = nan_tensor(Shape{N, rq}),
           kr = nan_tensor(Shape{N, rk});
    ops::mean_skip_forward(qpre, kpre, conv, qt, kt, N, dims);
    ops::qk_norm_forward(qr, kr, qpre, kpre, tau, N, dims);
    ops::rope_forward(qr, qr, rope, B, T, nq, hd);
    ops::rope_forward(kr, kr, rope, B, T, nkv, hd);
    Tensor dqr = gq.clone(), dkr = gk.clone(), dqpre = nan_tensor(Shape{N, rq}), dkpre = nan_tensor(Shape{N, rk});
    Tensor dconv = nan_tensor(Shape{N, C}), dqt = nan_tensor(Shape{N, rq}), dkt = nan_tensor(Shape{N, rk});
    Tensor dtau = Tensor::empty(Shape{nkv}, DType::f32);
    dtau.fill_(0.25);  // accumulated into
    ops::rope_backward(dqr, dqr, rope, B, T, nq, hd);
    ops::rope_backward(dkr, dkr, rope, B, T, nkv, hd);
    ops::qk_norm_backward(dqpre, dkpre, dtau, dqr, dkr, qpre, kpre, tau, N, dims);
    ops::mean_skip_backward(dconv, dqt, dkt, dqpre, dkpre, N, dims);
    Tensor dz = nan_tensor(Shape{N, C});  // [dq̃ | dk̃] per row, as the fused op writes it
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(dz.data<float>() + n * C, dqt.data<float>() + n * rq, rq * 4);
      std::memcpy(dz.data<float>() + n * C + rq, dkt.data<float>() + n * rk, rk * 4);
    }
    const int saved = num_threads();
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor fq = nan_tensor(Shape{N, rq}), fk = nan_tensor(Shape{N, rk}), fqpre = nan_tensor(Shape{N, rq}),
             fkpre = nan_tensor(Shape{N, rk});
      ops::cca_qk_forward(fq, fk, fqpre, fkpre, conv, z, tau, rope, B, T, dims);
      Tensor fdconv = nan_tensor(Shape{N, C}), fdz = nan_tensor(Shape{N, C}), fdtau = Tensor::empty(Shape{nkv}, DType::f32);
      fdtau.fill_(0.25);
      ops::cca_qk_backward(fdconv, fdz, fdtau, gq, gk, fqpre, fkpre, tau, rope, B, T, dims);
      for (auto [x, y, name] : {std::tuple{&qr, &fq, "q"}, {&kr, &fk, "k"}, {&qpre, &fqpre, "q_pre"},
                                {&kpre, &fkpre, "k_pre"}, {&dconv, &fdconv, "dconv"}, {&dz, &fdz, "dz"},
                                {&dtau, &fdtau, "dtemp"}})
        EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0) << name << ", hd " << hd << ", " << threads << " threads";
    }
    set_num_threads(saved);
  }
}

TEST(CcaQk, RejectsAShortRopeTableAndWrongShapes) {
  const int64_t B = 1, T = 8, nq = 2, nkv = 1, hd = 16, N = B * T;
  ops::CcaDims dims{nq, nkv, hd};
  Tensor conv = Tensor::zeros(Shape{N, dims.channels()}, DType::f32), q = Tensor::zeros(Shape{N, nq * hd}, DType::f32),
         k = Tensor::zeros(Shape{N, nkv * hd}, DType::f32), tau = Tensor::zeros(Shape{nkv}, DType::f32);
  Tensor qp = q.clone(), kp = k.clone(), z = conv.clone();
  const ops::RopeTable short_table = ops::make_rope_table(hd, 1.0, 10000.0, T - 1);
  try {
    ops::cca_qk_forward(q, k, qp, kp, conv, z, tau, short_table, B, T, dims);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the RoPE table's 7 positions"), std::string::npos) << e.what();
  }
  const ops::RopeTable table = ops::make_rope_table(hd, 1.0, 10000.0, T);
  Tensor bad = Tensor::zeros(Shape{N, dims.channels() + 1}, DType::f32);
  try {
    ops::cca_qk_forward(q, k, qp, kp, conv, bad, tau, table, B, T, dims);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("z has shape [8, 49], expected [8, 48]"), std::string::npos) << e.what();
  }
}

// With CUDA kernels (cuda/cca.cu), CUDA tensors where no GPU is present give a zaya::Error naming the
// op before any kernel runs (host memory under a CUDA label: skipped with a GPU, where
// test_cca_cuda.cc runs the ops on device memory); mixed devices name the argument.
TEST(CcaDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  const ops::CcaDims d{2, 1, 2};
  const int64_t B = 1, T = 2, N = B * T, C = d.channels(), half = 2;
  ops::CcaConvWeights w{cu({C, 1, 2}), cu({C}), cu({C, d.hd, 2}), cu({C})};
  ops::CcaConvWeights gw{cu({C, 1, 2}), cu({C}), cu({C, d.hd, 2}), cu({C})};
  Tensor z = cu({B, T, C}), out = cu({B, T, C}), dz = cu({B, T, C}), dout = cu({B, T, C});
  Tensor out1 = cu({B, 1, C}), state = cu({B, 2, C}), z1 = cu({B, 1, C});
  Tensor conv = cu({N, C}), dconv = cu({N, C});
  Tensor q = cu({N, d.nq * d.hd}), k = cu({N, d.nkv * d.hd}), q2 = cu({N, d.nq * d.hd}), k2 = cu({N, d.nkv * d.hd});
  Tensor dq = cu({N, d.nq * d.hd}), dk = cu({N, d.nkv * d.hd}), dq2 = cu({N, d.nq * d.hd}), dk2 = cu({N, d.nkv * d.hd});
  Tensor vcd = cu({B, T, 2 * half}), v = cu({B, T, 2 * half}), v1 = cu({B, 1, 2 * half}), vstate = cu({B, half});
  Tensor vc = cu({B, 1, half}), vd = cu({B, 1, half});
  Tensor temp = cu({d.nkv}), dtemp = cu({d.nkv});
  ops::RopeTable rope = ops::make_rope_table(d.hd, 1.0, 1e4, 4);
  Tensor cos_cpu = rope.cos, sin_cpu = rope.sin;
  rope.cos = test::as_cuda(cos_cpu);
  rope.sin = test::as_cuda(sin_cpu);
  ops::RopeTable cpu_rope = rope;
  cpu_rope.cos = cos_cpu;
  test::expect_mixed_devices("cca_qk_forward", "cos table",
                             [&] { ops::cca_qk_forward(q, k, q2, k2, conv, z, temp, cpu_rope, B, T, d); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_cca_cuda.cc runs these ops on it";
  using test::expect_needs_gpu;
  expect_needs_gpu("cca_conv_forward", [&] { ops::cca_conv_forward(out, z, w, B, T, d); });
  expect_needs_gpu("cca_conv_backward", [&] { ops::cca_conv_backward(dz, gw, dout, z, w, B, T, d); });
  expect_needs_gpu("cca_conv_decode", [&] { ops::cca_conv_decode(out1, state, z1, w, B, d); });
  expect_needs_gpu("mean_skip_forward", [&] { ops::mean_skip_forward(q, k, conv, q2, k2, N, d); });
  expect_needs_gpu("mean_skip_backward", [&] { ops::mean_skip_backward(dconv, dq, dk, dq2, dk2, N, d); });
  expect_needs_gpu("value_shift_forward", [&] { ops::value_shift_forward(v, vcd, B, T, half); });
  expect_needs_gpu("value_shift_backward", [&] { ops::value_shift_backward(vcd, v, B, T, half); });
  expect_needs_gpu("value_shift_decode", [&] { ops::value_shift_decode(v1, vstate, vc, vd, B, half); });
  expect_needs_gpu("qk_norm_forward", [&] { ops::qk_norm_forward(q2, k2, q, k, temp, N, d); });
  expect_needs_gpu("qk_norm_backward",
                   [&] { ops::qk_norm_backward(dq, dk, dtemp, dq2, dk2, q, k, temp, N, d); });
  expect_needs_gpu("cca_qk_forward", [&] { ops::cca_qk_forward(q, k, q2, k2, conv, z, temp, rope, B, T, d); });
  expect_needs_gpu("cca_qk_backward",
                   [&] { ops::cca_qk_backward(dconv, dz, dtemp, dq, dk, q2, k2, temp, rope, B, T, d); });
}

}  // namespace
}  // namespace zaya
