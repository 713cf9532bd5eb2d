// Dense ops against float64 references: forward values, backward by central finite differences of
// the reference (gradcheck.h), accumulation of parameter gradients, errors and the device dispatch.
// The CPU kernels' own choices (store modes, thread counts) are in cpu/test_dense_cpu.cc, the
// vector math under them in cpu/test_seq_vec.cc.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "device_or_emulated.h"
#include "ops/device_dispatch.h"
#include "zaya/core/cuda_runtime.h"
#include "ops/gradcheck.h"
#include "zaya/ops/dense.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;
using Ref = std::function<Vec(const std::vector<Vec>&)>;

// Forward: float32 ops round each of a handful of steps (and exp/erf are within ~1 ulp), so the
// normwise error vs double is a few 1e-7; 1e-5 leaves margin yet catches any formula mistake.
constexpr double kFwdTol = 1e-5;
// Backward vs central differences: the FD estimate is good to ~1e-9 (gradcheck.h); ours adds
// f32 rounding, including sums over up to ~130 rows/columns (~sqrt(130)·6e-8 ≈ 1e-6). 2e-5 margin.
constexpr double kGradTol = 2e-5;

// d/d inputs[which] of sum(g ⊙ ref(inputs)), by central differences in double.
Vec fd_grad(const Ref& ref, std::vector<Vec> inputs, int which, const Vec& g) {
  return test::numerical_gradient(
      [&](const Vec& v) {
        inputs[which] = v;
        return test::dot(g, ref(inputs));
      },
      inputs[which]);
}

Vec plus(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

struct Rows {
  int64_t n, f;
};
const Rows kShapes[] = {{7, 13}, {5, 70}, {3, 130}};

// ------------------------------------------------------------------------------------------- linear
Vec linear_ref(const std::vector<Vec>& in, int64_t n, int64_t i, int64_t o) {
  const Vec &x = in[0], &w = in[1], &b = in[2];
  Vec y(n * o);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < o; ++c) {
      double s = b[c];
      for (int64_t k = 0; k < i; ++k) s += x[r * i + k] * w[c * i + k];
      y[r * o + c] = s;
    }
  return y;
}

TEST(Linear, ForwardBackwardF32) {
  for (auto [n, in, out] : {std::tuple{7, 13, 11}, {1, 1, 1}, {9, 70, 33}}) {
    Tensor x = random_tensor({n, in}, 1), W = random_tensor({out, in}, 2), b = random_tensor({out}, 3);
    Tensor y = Tensor::empty({n, out}, DType::f32);
    Ref ref = [&](const std::vector<Vec>& v) { return linear_ref(v, n, in, out); };
    std::vector<Vec> inputs = {to_f64(x), to_f64(W), to_f64(b)};
    linear_forward(y, x, W, b);
    EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);

    Tensor g = random_tensor({n, out}, 4);
    Tensor dx = Tensor::empty({n, in}, DType::f32), dW = random_tensor({out, in}, 5),
           db = random_tensor({out}, 6);
    Vec dW0 = to_f64(dW), db0 = to_f64(db);
    linear_backward(dx, dW, db, g, x, W);
    Vec gv = to_f64(g);
    EXPECT_LT(test::rel_error(dx, fd_grad(ref, inputs, 0, gv)), kGradTol);
    EXPECT_LT(test::rel_error(dW, plus(dW0, fd_grad(ref, inputs, 1, gv))), kGradTol);  // accumulates
    EXPECT_LT(test::rel_error(db, plus(db0, fd_grad(ref, inputs, 2, gv))), kGradTol);
    // accumulate_dx: dx += dy·W on top of what dx held (another path's gradient).
    Tensor dx2 = random_tensor({n, in}, 7);
    Vec dx20 = to_f64(dx2);
    linear_backward(dx2, Tensor{}, Tensor{}, g, x, W, Tensor{}, /*accumulate_dx=*/true);
    EXPECT_LT(test::rel_error(dx2, plus(dx20, fd_grad(ref, inputs, 0, gv))), kGradTol);
  }
}

TEST(Linear, Bf16Path) {
  const int64_t n = 7, in = 13, out = 11;
  Tensor x = random_tensor({n, in}, 1, 1.0f, DType::bf16), W = random_tensor({out, in}, 2, 1.0f, DType::bf16);
  Tensor y = Tensor::empty({n, out}, DType::f32);
  Vec zero_b(out, 0.0);
  Ref ref = [&](const std::vector<Vec>& v) { return linear_ref(v, n, in, out); };
  std::vector<Vec> inputs = {to_f64(x), to_f64(W), zero_b};
  linear_forward(y, x, W, Tensor{});
  // The bf16 inputs are exact in double: only f32 accumulation differs.
  EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);
  Tensor g = random_tensor({n, out}, 4);
  Tensor g_bf16 = Tensor::empty({n, out}, DType::bf16);
  Tensor dx = Tensor::empty({n, in}, DType::f32), dW = Tensor::zeros({out, in}, DType::f32);
  linear_backward(dx, dW, Tensor{}, g, x, W, g_bf16);
  // The GEMMs see dy rounded to bf16: compare against the gradient for that rounded dy, exactly
  // representable, so again only f32 accumulation (and FD) error remains.
  Vec g_rounded = to_f64(g_bf16);
  for (size_t i = 0; i < g_rounded.size(); ++i)
    ASSERT_EQ(g_rounded[i], to_float(to_bf16(g.data<float>()[i])));
  EXPECT_LT(test::rel_error(dx, fd_grad(ref, inputs, 0, g_rounded)), kGradTol);
  EXPECT_LT(test::rel_error(dW, fd_grad(ref, inputs, 1, g_rounded)), kGradTol);
  EXPECT_THROW(linear_backward(dx, dW, Tensor{}, g, x, W), Error);  // bf16 needs the dy workspace
}

// ---------------------------------------------------------------------------------------- embedding
TEST(Embedding, ForwardBackwardWithRepeatsAndPadding) {
  const int64_t vocab = 11, h = 70;
  std::vector<int32_t> id_values = {3, 0, 3, 10, 5, 3, 0, 7, 10};
  Tensor ids = Tensor::empty({3, 3}, DType::i32);
  std::memcpy(ids.raw(), id_values.data(), id_values.size() * 4);
  const int64_t n = 9;
  Tensor E = random_tensor({vocab, h}, 1), y = Tensor::empty({n, h}, DType::f32);
  embedding_forward(y, ids, E);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(0, std::memcmp(y.data<float>() + i * h, E.data<float>() + id_values[i] * h, h * 4)) << i;

  Tensor g = random_tensor({n, h}, 2), dE = random_tensor({vocab, h}, 3);
  Vec expect = to_f64(dE), gv = to_f64(g);
  const int64_t pad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (id_values[i] != pad)
      for (int64_t j = 0; j < h; ++j) expect[id_values[i] * h + j] += gv[i * h + j];
  embedding_backward(dE, g, ids, pad);
  // At most three float additions per element: relative error ~3·2^-24.
  EXPECT_LT(test::rel_error(dE, expect), 1e-6);
  for (int64_t j = 0; j < h; ++j)
    EXPECT_EQ(dE.data<float>()[pad * h + j], static_cast<float>(expect[pad * h + j]));
}

TEST(Embedding, OutOfRangeIdNamesIdAndVocab) {
  Tensor E = random_tensor({11, 4}, 1), y = Tensor::empty({2, 4}, DType::f32);
  for (int32_t bad : {11, -1}) {
    Tensor ids = Tensor::empty({2}, DType::i32);
    ids.data<int32_t>()[0] = 2;
    ids.data<int32_t>()[1] = bad;
    try {
      embedding_forward(y, ids, E);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("11"), std::string::npos) << msg;
    }
    EXPECT_THROW(embedding_backward(E, y, ids, -1), Error);
  }
}

// A bf16 table (the model's bf16 weights) gives exactly the f32 op on the table widened element by
// element with core's to_float: a gather plus an exact conversion, so bitwise equal (tolerance 0).
TEST(Embedding, Bf16TableIsTheF32OpOnTheWidenedTableBitwise) {
  for (auto [vocab, h, n] : {std::tuple<int64_t, int64_t, int64_t>{11, 70, 9}, {1, 1, 3}, {300, 33, 257}}) {
    SCOPED_TRACE(testing::Message() << "V " << vocab << " H " << h << " N " << n);
    Tensor E16 = random_tensor({vocab, h}, 31, 2.0f, DType::bf16);
    // Values a conversion could get wrong: ±0, ±inf, a NaN, the smallest subnormal, the largest finite.
    const uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x7f7f};
    for (size_t k = 0; k < std::size(special) && static_cast<int64_t>(k) < E16.numel(); ++k)
      E16.data<bf16>()[k * 5 % E16.numel()].bits = special[k];
    Tensor E = Tensor::empty({vocab, h}, DType::f32);
    for (int64_t i = 0; i < E.numel(); ++i) E.data<float>()[i] = to_float(E16.data<bf16>()[i]);
    Tensor ids = Tensor::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % vocab);  // repeats
    Tensor y16 = random_tensor({n, h}, 32), y = random_tensor({n, h}, 33);  // garbage: y is written
    embedding_forward(y16, ids, E16);
    embedding_forward(y, ids, E);
    EXPECT_EQ(0, std::memcmp(y16.raw(), y.raw(), y.nbytes()));
  }
  Tensor E16 = random_tensor({11, 4}, 34, 1.0f, DType::bf16), y = Tensor::empty({2, 4}, DType::f32);
  Tensor ids = Tensor::empty({2}, DType::i32);
  ids.data<int32_t>()[0] = 2;
  ids.data<int32_t>()[1] = 11;
  const std::string msg = test::error_of([&] { embedding_forward(y, ids, E16); });
  EXPECT_NE(msg.find("token id 11 at position 1 is outside the vocabulary [0, 11)"), std::string::npos) << msg;
}

TEST(Embedding, WrongDtypesAndShapesAreNamed) {
  Tensor ids = Tensor::zeros({3}, DType::i32), y = Tensor::empty({3, 4}, DType::f32);
  EXPECT_EQ(test::error_of([&] { embedding_forward(y, ids, Tensor::zeros({5, 4}, DType::f64)); }),
            "embedding_forward: E must be f32 or bf16, found f64[5, 4] cpu");
  EXPECT_EQ(test::error_of([&] { embedding_forward(y, ids, Tensor::zeros({5, 4}, DType::i32)); }),
            "embedding_forward: E must be f32 or bf16, found i32[5, 4] cpu");
  Tensor E16 = Tensor::zeros({5, 4}, DType::bf16);
  EXPECT_EQ(test::error_of([&] { embedding_forward(Tensor::empty({3, 4}, DType::bf16), ids, E16); }),
            "embedding_forward: y must be f32, found bf16[3, 4] cpu");
  EXPECT_NE(test::error_of([&] { embedding_forward(y, ids, Tensor::zeros({20}, DType::bf16)); })
                .find("embedding_forward: E must be [V, H]"),
            std::string::npos);
  const std::string wrong_y = test::error_of([&] { embedding_forward(Tensor::empty({3, 5}, DType::f32), ids, E16); });
  EXPECT_NE(wrong_y.find("embedding_forward: y"), std::string::npos) << wrong_y;
  EXPECT_NE(wrong_y.find("[3, 4]"), std::string::npos) << wrong_y;
  EXPECT_NE(wrong_y.find("[3, 5]"), std::string::npos) << wrong_y;
}

// ------------------------------------------------------------------------------------------ rmsnorm
TEST(RmsNorm, ForwardBackward) {
  const double eps = 1e-5;
  for (Rows s : kShapes) {
    Tensor x = random_tensor({s.n, s.f}, 1), w = random_tensor({s.f}, 2);
    Ref ref = [&](const std::vector<Vec>& v) {
      Vec y(s.n * s.f);
      for (int64_t r = 0; r < s.n; ++r) {
        double ms = 0;
        for (int64_t j = 0; j < s.f; ++j) ms += v[0][r * s.f + j] * v[0][r * s.f + j];
        double rs = 1 / std::sqrt(ms / s.f + eps);
        for (int64_t j = 0; j < s.f; ++j) y[r * s.f + j] = v[1][j] * v[0][r * s.f + j] * rs;
      }
      return y;
    };
    std::vector<Vec> inputs = {to_f64(x), to_f64(w)};
    Tensor y = Tensor::empty({s.n, s.f}, DType::f32), rstd = Tensor::empty({s.n}, DType::f32);
    rmsnorm_forward(y, rstd, x, w, static_cast<float>(eps));
    EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);
    Tensor g = random_tensor({s.n, s.f}, 3), dx = Tensor::empty({s.n, s.f}, DType::f32),
           dw = random_tensor({s.f}, 4);
    Vec dw0 = to_f64(dw), gv = to_f64(g);
    rmsnorm_backward(dx, dw, g, x, w, rstd);
    EXPECT_LT(test::rel_error(dx, fd_grad(ref, inputs, 0, gv)), kGradTol) << s.n << "x" << s.f;
    EXPECT_LT(test::rel_error(dw, plus(dw0, fd_grad(ref, inputs, 1, gv))), kGradTol) << s.n << "x" << s.f;
    // accumulate_dx, with and without the weight gradient (two code paths).
    for (bool with_dw : {true, false}) {
      Tensor dx2 = random_tensor({s.n, s.f}, 5);
      Vec dx20 = to_f64(dx2);
      rmsnorm_backward(dx2, with_dw ? dw : Tensor{}, g, x, w, rstd, /*accumulate_dx=*/true);
      EXPECT_LT(test::rel_error(dx2, plus(dx20, fd_grad(ref, inputs, 0, gv))), kGradTol) << s.n << "x" << s.f;
    }
  }
}

TEST(RmsNorm, WeightGradientOverManyRowChunks) {
  // dw = Σ_rows dy ⊙ x·rstd is summed in 64-row chunks, then chunk by chunk: against float64 over
  // 3 full chunks and a partial one. f32 sums of 200 terms of O(1): ~1e-6 relative; bound 1e-5.
  const int64_t n = 205, f = 37;
  Tensor x = random_tensor({n, f}, 3), w = random_tensor({f}, 4), g = random_tensor({n, f}, 5);
  Tensor y = Tensor::empty({n, f}, DType::f32), rstd = Tensor::empty({n}, DType::f32);
  rmsnorm_forward(y, rstd, x, w, 1e-5f);
  Tensor dw = Tensor::zeros({f}, DType::f32), dx = Tensor::empty({n, f}, DType::f32);
  rmsnorm_backward(dx, dw, g, x, w, rstd);
  Vec xv = to_f64(x), gv = to_f64(g), ref(f, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < f; ++j) ms += xv[r * f + j] * xv[r * f + j];
    double rs = 1 / std::sqrt(ms / f + 1e-5);
    for (int64_t j = 0; j < f; ++j) ref[j] += gv[r * f + j] * xv[r * f + j] * rs;
  }
  EXPECT_LT(test::rel_error(dw, ref), 1e-5);
  // dx alone (no dw) takes the row-only path and gives the same dx.
  Tensor dx2 = Tensor::empty({n, f}, DType::f32);
  rmsnorm_backward(dx2, Tensor{}, g, x, w, rstd);
  EXPECT_EQ(to_f64(dx2), to_f64(dx));
}

TEST(ResidualScale, ParameterGradientsOverManyRowChunks) {
  // The four parameter sums run in 64-row chunks added chunk by chunk: against float64 over 3
  // full chunks and a partial one. f32 sums of ~200 O(1) terms: ~1e-6 relative; bound 1e-5.
  const int64_t n = 205, f = 37;
  Tensor h = random_tensor({n, f}, 6), x = random_tensor({n, f}, 7), g = random_tensor({n, f}, 8);
  ResidualScaleParams p{random_tensor({f}, 9), random_tensor({f}, 10), random_tensor({f}, 11),
                        random_tensor({f}, 12)};
  ResidualScaleParams gr{Tensor::zeros({f}, DType::f32), Tensor::zeros({f}, DType::f32),
                         Tensor::zeros({f}, DType::f32), Tensor::zeros({f}, DType::f32)};
  Tensor dh = Tensor::empty({n, f}, DType::f32), dx = Tensor::empty({n, f}, DType::f32);
  residual_scale_backward(dh, dx, gr, g, h, x, p);
  Vec hv = to_f64(h), xv = to_f64(x), gv = to_f64(g), bh = to_f64(p.hidden_bias), bx = to_f64(p.residual_bias);
  Vec sh = to_f64(p.hidden_scale), sx = to_f64(p.residual_scale);
  Vec d_sh(f, 0.0), d_bh(f, 0.0), d_sx(f, 0.0), d_bx(f, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const int64_t k = r * f + j;
      d_sh[j] += gv[k] * (hv[k] + bh[j]);
      d_bh[j] += gv[k] * sh[j];
      d_sx[j] += gv[k] * (xv[k] + bx[j]);
      d_bx[j] += gv[k] * sx[j];
    }
  EXPECT_LT(test::rel_error(gr.hidden_scale, d_sh), 1e-5);
  EXPECT_LT(test::rel_error(gr.hidden_bias, d_bh), 1e-5);
  EXPECT_LT(test::rel_error(gr.residual_scale, d_sx), 1e-5);
  EXPECT_LT(test::rel_error(gr.residual_bias, d_bx), 1e-5);
}

TEST(RmsNorm, ShapeErrorNamesBothShapes) {
  Tensor x = random_tensor({7, 13}, 1), w = random_tensor({13}, 2);
  Tensor y = Tensor::empty({7, 12}, DType::f32), rstd = Tensor::empty({7}, DType::f32);
  try {
    rmsnorm_forward(y, rstd, x, w, 1e-5f);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[7, 12]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[7, 13]"), std::string::npos) << msg;
  }
  Tensor w_bad = random_tensor({12}, 2), y_ok = Tensor::empty({7, 13}, DType::f32);
  EXPECT_THROW(rmsnorm_forward(y_ok, rstd, x, w_bad, 1e-5f), Error);
}

// ----------------------------------------------------------------------------------- residual scale
TEST(ResidualScale, ForwardBackward) {
  for (Rows s : kShapes) {
    int64_t n = s.n, f = s.f;
    Tensor h = random_tensor({n, f}, 1), x = random_tensor({n, f}, 2);
    ResidualScaleParams p{random_tensor({f}, 3), random_tensor({f}, 4), random_tensor({f}, 5),
                          random_tensor({f}, 6)};
    Ref ref = [&](const std::vector<Vec>& v) {  // v: h, x, s_h, b_h, s_x, b_x
      Vec y(n * f);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < f; ++j) {
          int64_t k = r * f + j;
          y[k] = (v[0][k] + v[3][j]) * v[2][j] + (v[1][k] + v[5][j]) * v[4][j];
        }
      return y;
    };
    std::vector<Vec> inputs = {to_f64(h),
                               to_f64(x),
                               to_f64(p.hidden_scale),
                               to_f64(p.hidden_bias),
                               to_f64(p.residual_scale),
                               to_f64(p.residual_bias)};
    Tensor y = Tensor::empty({n, f}, DType::f32);
    residual_scale_forward(y, h, x, p);
    EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);
    Tensor g = random_tensor({n, f}, 7), dh = Tensor::empty({n, f}, DType::f32),
           dx = Tensor::empty({n, f}, DType::f32);
    ResidualScaleParams grads{random_tensor({f}, 8), random_tensor({f}, 9), random_tensor({f}, 10),
                              random_tensor({f}, 11)};
    std::vector<Vec> grads0 = {to_f64(grads.hidden_scale), to_f64(grads.hidden_bias),
                               to_f64(grads.residual_scale), to_f64(grads.residual_bias)};
    residual_scale_backward(dh, dx, grads, g, h, x, p);
    Vec gv = to_f64(g);
    EXPECT_LT(test::rel_error(dh, fd_grad(ref, inputs, 0, gv)), kGradTol);
    EXPECT_LT(test::rel_error(dx, fd_grad(ref, inputs, 1, gv)), kGradTol);
    const Tensor* gt[] = {&grads.hidden_scale, &grads.hidden_bias, &grads.residual_scale,
                          &grads.residual_bias};
    for (int k = 0; k < 4; ++k)
      EXPECT_LT(test::rel_error(*gt[k], plus(grads0[k], fd_grad(ref, inputs, 2 + k, gv))), kGradTol)
          << "param " << k;
  }
}

// The bf16-h form (the model's bf16 saved o and m, ZayaModel::set_activation_dtype): h is read
// widened, which is exact, into the same expression, so every output is bitwise the f32 op's on the
// widened h (tolerance 0), over 3 full 64-row chunks of the column sums and a partial one, with and
// without dh and dx. Only ds_h reads h: against the f32 op on the unrounded h, dh, dx and the other
// three parameter gradients are bitwise the same and ds_h differs (the rounded values were read).
TEST(ResidualScale, Bf16HIsTheF32OpOnTheWidenedHBitwise) {
  const int64_t n = 205, f = 37;
  Tensor h = random_tensor({n, f}, 21), x = random_tensor({n, f}, 22), g = random_tensor({n, f}, 23);
  Tensor h16 = Tensor::empty({n, f}, DType::bf16), widened = Tensor::empty({n, f}, DType::f32);
  cast_to_bf16(h16, h);
  cast_to_f32(widened, h16);
  const ResidualScaleParams p{random_tensor({f}, 24), random_tensor({f}, 25), random_tensor({f}, 26),
                              random_tensor({f}, 27)};
  struct Out {
    Tensor dh, dx;
    ResidualScaleParams grads;
  };
  auto backward = [&](const Tensor& hh, bool with_dhdx) {
    // The parameter gradients start nonzero: they accumulate.
    auto out = [&] { return with_dhdx ? Tensor::empty({n, f}, DType::f32) : Tensor{}; };
    Out o{out(), out(),
          {random_tensor({f}, 30), random_tensor({f}, 31), random_tensor({f}, 32), random_tensor({f}, 33)}};
    residual_scale_backward(o.dh, o.dx, o.grads, g, hh, x, p);
    return o;
  };
  auto same = [](const Tensor& a, const Tensor& b) { return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0; };
  for (bool with_dhdx : {true, false}) {
    SCOPED_TRACE(with_dhdx ? "with dh, dx" : "parameter gradients only");
    const Out a = backward(h16, with_dhdx), b = backward(widened, with_dhdx), c = backward(h, with_dhdx);
    EXPECT_TRUE(same(a.grads.hidden_scale, b.grads.hidden_scale));
    EXPECT_TRUE(same(a.grads.hidden_bias, b.grads.hidden_bias));
    EXPECT_TRUE(same(a.grads.residual_scale, b.grads.residual_scale));
    EXPECT_TRUE(same(a.grads.residual_bias, b.grads.residual_bias));
    EXPECT_FALSE(same(a.grads.hidden_scale, c.grads.hidden_scale));
    EXPECT_TRUE(same(a.grads.hidden_bias, c.grads.hidden_bias));
    EXPECT_TRUE(same(a.grads.residual_scale, c.grads.residual_scale));
    EXPECT_TRUE(same(a.grads.residual_bias, c.grads.residual_bias));
    if (with_dhdx) {
      EXPECT_TRUE(same(a.dh, b.dh) && same(a.dx, b.dx));
      EXPECT_TRUE(same(a.dh, c.dh) && same(a.dx, c.dx));
    }
  }
}

TEST(ResidualScale, HDtypesAndShapesAreNamed) {
  const int64_t n = 4, f = 8;
  Tensor x = random_tensor({n, f}, 1), dy = random_tensor({n, f}, 2), y = Tensor::empty({n, f}, DType::f32);
  const ResidualScaleParams p{random_tensor({f}, 3), random_tensor({f}, 4), random_tensor({f}, 5),
                              random_tensor({f}, 6)};
  const ResidualScaleParams g{Tensor::zeros({f}, DType::f32), Tensor::zeros({f}, DType::f32),
                              Tensor::zeros({f}, DType::f32), Tensor::zeros({f}, DType::f32)};
  const Tensor h_i32 = Tensor::zeros({n, f}, DType::i32);
  EXPECT_EQ(test::error_of([&] { residual_scale_backward(Tensor{}, Tensor{}, g, dy, h_i32, x, p); }),
            "residual_scale_backward: h must be f32 or bf16, found i32[4, 8] cpu");
  const std::string shape = test::error_of(
      [&] { residual_scale_backward(Tensor{}, Tensor{}, g, dy, Tensor::zeros({n, f + 1}, DType::bf16), x, p); });
  EXPECT_NE(shape.find("residual_scale_backward: x vs h"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[4, 9]"), std::string::npos) << shape;
  // The forward reads h's f32 values (the model computes from them): bf16 is refused there.
  EXPECT_EQ(test::error_of([&] { residual_scale_forward(y, Tensor::zeros({n, f}, DType::bf16), x, p); }),
            "residual_scale_forward: h must be f32, found bf16[4, 8] cpu");
}

// -------------------------------------------------------------------------------------- activations
using Fwd = void (*)(const Tensor&, const Tensor&);
using Bwd = void (*)(const Tensor&, const Tensor&, const Tensor&);

void check_elementwise(Fwd fwd, Bwd bwd, double (*f)(double)) {
  for (Rows s : kShapes) {
    Tensor x = random_tensor({s.n, s.f}, 1, 2.0f);  // scale 2: both tails of the curve
    Ref ref = [&](const std::vector<Vec>& v) {
      Vec y(v[0].size());
      for (size_t i = 0; i < y.size(); ++i) y[i] = f(v[0][i]);
      return y;
    };
    std::vector<Vec> inputs = {to_f64(x)};
    Tensor y = Tensor::empty({s.n, s.f}, DType::f32);
    fwd(y, x);
    EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);
    Tensor g = random_tensor({s.n, s.f}, 2);
    Vec gv = to_f64(g);
    Tensor dx = Tensor::empty({s.n, s.f}, DType::f32);
    bwd(dx, g, x);
    EXPECT_LT(test::rel_error(dx, fd_grad(ref, inputs, 0, gv)), kGradTol);
    bwd(g, g, x);  // in place: dx == dy
    EXPECT_EQ(0, std::memcmp(g.raw(), dx.raw(), dx.nbytes()));
  }
}

double silu_d(double x) { return x / (1 + std::exp(-x)); }
double gelu_d(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

TEST(Activations, Silu) { check_elementwise(silu_forward, silu_backward, silu_d); }
TEST(Activations, GeluExactErf) { check_elementwise(gelu_forward, gelu_backward, gelu_d); }

TEST(Activations, SwiGlu) {
  for (Rows s : kShapes) {
    int64_t n = s.n, inter = s.f;
    Tensor gu = random_tensor({n, 2 * inter}, 1, 2.0f);
    Ref ref = [&](const std::vector<Vec>& v) {
      Vec y(n * inter);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < inter; ++j)
          y[r * inter + j] = silu_d(v[0][r * 2 * inter + j]) * v[0][r * 2 * inter + inter + j];
      return y;
    };
    std::vector<Vec> inputs = {to_f64(gu)};
    Tensor y = Tensor::empty({n, inter}, DType::f32);
    swiglu_forward(y, gu);
    EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);
    Tensor g = random_tensor({n, inter}, 2), dgu = Tensor::empty({n, 2 * inter}, DType::f32);
    swiglu_backward(dgu, g, gu);
    EXPECT_LT(test::rel_error(dgu, fd_grad(ref, inputs, 0, to_f64(g))), kGradTol);
  }
  Tensor odd = random_tensor({3, 7}, 1), y = Tensor::empty({3, 3}, DType::f32);
  EXPECT_THROW(swiglu_forward(y, odd), Error);
}

// Far tails: σ(x) for x < −80 and the normal pdf φ(x) for x² > 160 are exactly 0 (the kernels
// clamp before they could compute a subnormal, which x86 runs through microcode assists), and
// inside the tail's edge they follow the double reference. NaN still propagates.
TEST(Activations, FarNegativeTailsAreExactZeros) {
  const float xs[] = {-1000.0f, -100.0f, -88.5f, -80.5f, -79.5f, -60.0f, -13.0f, -12.0f, -5.0f, 0.5f};
  const int64_t n = std::size(xs);
  // SwiGLU with these as gates and values of 1: y = silu(g), dv = dy·silu(g), dg = dy·silu'(g).
  Tensor gu = Tensor::empty({1, 2 * n}, DType::f32), y = Tensor::empty({1, n}, DType::f32);
  Tensor dy = Tensor::empty({1, n}, DType::f32), dgu = Tensor::empty({1, 2 * n}, DType::f32);
  for (int64_t j = 0; j < n; ++j) {
    gu.data<float>()[j] = xs[j];
    gu.data<float>()[n + j] = 1.0f;
    dy.data<float>()[j] = 1.0f;
  }
  swiglu_forward(y, gu);
  swiglu_backward(dgu, dy, gu);
  Tensor x = Tensor::empty({1, n}, DType::f32), gx = x.clone();
  std::copy_n(xs, n, x.data<float>());
  gelu_backward(gx, dy, x);
  for (int64_t j = 0; j < n; ++j) {
    const double v = xs[j], sig = 1.0 / (1.0 + std::exp(-v));
    const double silu = v * sig, silu_grad = sig * (1.0 + v * (1.0 - sig));
    const double gelu_grad =
        0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    if (v < -80.0) {
      EXPECT_EQ(y.data<float>()[j], 0.0f) << v;
      EXPECT_EQ(dgu.data<float>()[j], 0.0f) << v;
      EXPECT_EQ(dgu.data<float>()[n + j], 0.0f) << v;
    } else {  // ~2 ulp of expf_fast and the division, relative
      EXPECT_NEAR(y.data<float>()[j], silu, 1e-6 * std::fabs(silu)) << v;
      EXPECT_NEAR(dgu.data<float>()[n + j], silu, 1e-6 * std::fabs(silu)) << v;
      EXPECT_NEAR(dgu.data<float>()[j], silu_grad, 1e-6 * std::fabs(silu_grad) + 1e-37) << v;
    }
    // ½(1 + erf) is formed at the scale of 1, so it carries ~ulp(1) absolute error (float, like
    // torch's): the bound is 1e-7 absolute besides 1e-6 relative.
    if (0.5 * v * v > 80.0)
      EXPECT_EQ(gx.data<float>()[j], 0.0f) << v;
    else
      EXPECT_NEAR(gx.data<float>()[j], gelu_grad, 1e-6 * std::fabs(gelu_grad) + 1e-7) << v;
  }
  Tensor nan_in = Tensor::empty({1, 2}, DType::f32), nan_out = Tensor::empty({1, 1}, DType::f32);
  nan_in.data<float>()[0] = NAN, nan_in.data<float>()[1] = 1.0f;
  swiglu_forward(nan_out, nan_in);
  EXPECT_TRUE(std::isnan(nan_out.data<float>()[0]));
}

TEST(Softmax, ForwardBackward) {
  for (Rows s : kShapes) {
    Tensor x = random_tensor({s.n, s.f}, 1, 3.0f);
    Ref ref = [&](const std::vector<Vec>& v) {
      Vec y(v[0].size());
      for (int64_t r = 0; r < s.n; ++r) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s.f; ++j) mx = std::max(mx, v[0][r * s.f + j]);
        for (int64_t j = 0; j < s.f; ++j) sum += std::exp(v[0][r * s.f + j] - mx);
        for (int64_t j = 0; j < s.f; ++j) y[r * s.f + j] = std::exp(v[0][r * s.f + j] - mx) / sum;
      }
      return y;
    };
    std::vector<Vec> inputs = {to_f64(x)};
    Tensor y = Tensor::empty({s.n, s.f}, DType::f32);
    softmax_forward(y, x);
    EXPECT_LT(test::rel_error(y, ref(inputs)), kFwdTol);
    Tensor g = random_tensor({s.n, s.f}, 2), dx = Tensor::empty({s.n, s.f}, DType::f32);
    softmax_backward(dx, g, y);
    EXPECT_LT(test::rel_error(dx, fd_grad(ref, inputs, 0, to_f64(g))), kGradTol);
  }
}

// The dense fronts, handed CUDA tensors (host memory labelled CUDA: device_dispatch.h), check them as
// on the CPU before any dispatch.
TEST(DenseDevice, CudaTensorsAreCheckedBeforeTheDispatch) {
  using test::as_cuda;
  const int64_t n = 4, f = 8;
  Tensor x = as_cuda(random_tensor({n, f}, 1)), y = as_cuda(random_tensor({n, f}, 2));
  Tensor dy = as_cuda(random_tensor({n, f}, 3)), dx = as_cuda(random_tensor({n, f}, 4));
  Tensor W = as_cuda(random_tensor({f, f}, 5)), dW = as_cuda(random_tensor({f, f}, 6));
  Tensor w = as_cuda(random_tensor({f}, 7)), dw = as_cuda(random_tensor({f}, 8));
  Tensor rstd = as_cuda(random_tensor({n}, 9));
  Tensor x16 = as_cuda(Tensor::zeros({n, f}, DType::bf16));
  // The message names the argument with its dtype, shape and device; the checks run before the
  // dispatch, for every device.
  EXPECT_EQ(test::error_of([&] { rmsnorm_forward(y, rstd, x16, w, 1e-6f); }),
            "rmsnorm_forward: x must be f32, found bf16[4, 8] cuda");
  EXPECT_NE(test::error_of([&] { linear_forward(y, x, W, dW.select(0).slice(0, 3)); }).find("linear_forward"),
            std::string::npos);  // a bias of the wrong length
  EXPECT_NE(test::error_of([&] { linear_backward(dx, dW, dw, dy, x16, W); }).find("both be f32 or both bf16"),
            std::string::npos);
}

// The fronts with a CUDA kernel (cuda/dense.cu), handed CUDA tensors where no GPU is present, give
// a zaya::Error naming the op and saying why, before any kernel could touch the memory (here host
// memory under a CUDA label, which a real GPU kernel would fault on: hence skipped with a GPU,
// where test_dense_cuda.cc runs them on device memory).
TEST(DenseDevice, CudaKernelsWithoutAGpuGiveAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_dense_cuda.cc runs these ops on it";
  using test::as_cuda;
  const int64_t n = 4, f = 8;
  Tensor x = as_cuda(random_tensor({n, f}, 1)), y = as_cuda(random_tensor({n, f}, 2));
  Tensor dy = as_cuda(random_tensor({n, f}, 3)), dx = as_cuda(random_tensor({n, f}, 4));
  Tensor w = as_cuda(random_tensor({f}, 7)), dw = as_cuda(random_tensor({f}, 8));
  Tensor rstd = as_cuda(random_tensor({n}, 9));
  Tensor ids = as_cuda(Tensor::zeros({n}, DType::i32)), E = as_cuda(random_tensor({16, f}, 10));
  Tensor gu = as_cuda(random_tensor({n, 2 * f}, 11)), dgu = as_cuda(random_tensor({n, 2 * f}, 12));
  Tensor x16 = as_cuda(Tensor::zeros({n, f}, DType::bf16));
  const ResidualScaleParams p{w, w, w, w}, g{dw, dw, dw, dw};
  using test::expect_needs_gpu;
  expect_needs_gpu("embedding_forward", [&] { embedding_forward(y, ids, E); });
  expect_needs_gpu("embedding_backward", [&] { embedding_backward(E, dy, ids); });
  expect_needs_gpu("rmsnorm_forward", [&] { rmsnorm_forward(y, rstd, x, w, 1e-6f); });
  expect_needs_gpu("rmsnorm_backward", [&] { rmsnorm_backward(dx, dw, dy, x, w, rstd); });
  expect_needs_gpu("residual_scale_forward", [&] { residual_scale_forward(y, x, x, p); });
  expect_needs_gpu("residual_scale_backward", [&] { residual_scale_backward(dx, dx, g, dy, x, x, p); });
  expect_needs_gpu("silu_forward", [&] { silu_forward(y, x); });
  expect_needs_gpu("silu_backward", [&] { silu_backward(dx, dy, x); });
  expect_needs_gpu("gelu_forward", [&] { gelu_forward(y, x); });
  expect_needs_gpu("gelu_backward", [&] { gelu_backward(dx, dy, x); });
  expect_needs_gpu("swiglu_forward", [&] { swiglu_forward(y, gu); });
  expect_needs_gpu("swiglu_backward", [&] { swiglu_backward(dgu, dy, gu); });
  expect_needs_gpu("cast_to_bf16", [&] { cast_to_bf16(x16, x); });
  expect_needs_gpu("cast_to_f32", [&] { cast_to_f32(x, x16); });
  Tensor E16 = as_cuda(Tensor::zeros({16, f}, DType::bf16));
  expect_needs_gpu("embedding_forward", [&] { embedding_forward(y, ids, E16); });
  expect_needs_gpu("softmax_forward", [&] { softmax_forward(y, x); });
  expect_needs_gpu("softmax_backward", [&] { softmax_backward(dx, dy, y); });
  Tensor W = as_cuda(random_tensor({f, f}, 5)), dW = as_cuda(random_tensor({f, f}, 6));
  expect_needs_gpu("linear_forward", [&] { linear_forward(y, x, W, w); });
  expect_needs_gpu("linear_backward", [&] { linear_backward(dx, dW, dw, dy, x, W); });
}

TEST(DenseDevice, MixedDevicesAreRejectedNamingTheArgument) {
  const int64_t n = 4, f = 8;
  Tensor x = random_tensor({n, f}, 1), y = Tensor::empty({n, f}, DType::f32);
  Tensor w = random_tensor({f}, 7), rstd = Tensor::empty({n}, DType::f32);
  Tensor W = random_tensor({f, f}, 5);
  using test::as_cuda;
  using test::expect_mixed_devices;
  expect_mixed_devices("rmsnorm_forward", "y", [&] { rmsnorm_forward(as_cuda(y), rstd, x, w, 1e-6f); });
  expect_mixed_devices("rmsnorm_forward", "w", [&] { rmsnorm_forward(y, rstd, as_cuda(x), w, 1e-6f); });
  expect_mixed_devices("linear_forward", "W", [&] { linear_forward(y, x, as_cuda(W), {}); });
  expect_mixed_devices("silu_forward", "y", [&] { silu_forward(as_cuda(y), x); });
  Tensor x16 = Tensor::zeros({n, f}, DType::bf16), ids = Tensor::zeros({n}, DType::i32);
  expect_mixed_devices("cast_to_f32", "dst", [&] { cast_to_f32(as_cuda(y), x16); });
  expect_mixed_devices("embedding_forward", "E", [&] { embedding_forward(y, ids, as_cuda(x16)); });
  // The whole message: the op, the argument and both tensors with their devices.
  EXPECT_EQ(test::error_of([&] { silu_forward(y, as_cuda(x)); }),
            "silu_forward: y is f32[4, 8] cpu, but x is f32[4, 8] cuda: every tensor of one call must be on the "
            "same device");
}

// The bf16-table embedding and cast_to_f32 on Device::cuda tensors: on a GPU the CUDA kernels, else
// the emulated device (docs/cuda.md), whose fronts must dispatch them to the CPU kernels. Both are
// exact (a gather and a widening), so the device's result is the CPU's bit for bit on either.
TEST(DenseDevice, Bf16TableEmbeddingAndCastToF32OnTheDeviceAreBitwiseTheCpus) {
  ZAYA_GPU_OR_EMULATED(real);
  const test::EmulationOffAtExit off{!real};  // other tests of this binary expect no device
  const int64_t vocab = 13, h = 37, n = 40;
  Tensor ids = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 5) % vocab);
  Tensor E16 = random_tensor({vocab, h}, 51, 2.0f, DType::bf16);
  Tensor y = Tensor::empty({n, h}, DType::f32), y_dev = Tensor::empty({n, h}, DType::f32, Device::cuda);
  embedding_forward(y, ids, E16);
  embedding_forward(y_dev, ids.to(Device::cuda), E16.to(Device::cuda));
  const Tensor y_back = y_dev.to(Device::cpu);
  EXPECT_EQ(0, std::memcmp(y_back.raw(), y.raw(), y.nbytes()));

  Tensor wide = Tensor::empty({vocab * h}, DType::f32), wide_dev = Tensor::empty({vocab * h}, DType::f32, Device::cuda);
  cast_to_f32(wide, E16);
  cast_to_f32(wide_dev, E16.to(Device::cuda));
  const Tensor wide_back = wide_dev.to(Device::cpu);
  EXPECT_EQ(0, std::memcmp(wide_back.raw(), wide.raw(), wide.nbytes()));
}

TEST(CastToBf16, RoundsEveryElementToNearestEven) {
  // Against the scalar reference conversion (core's to_bf16, itself tested on ties, subnormals,
  // inf and NaN): exact equality, the same rounding applied element by element.
  Tensor x = test::random_tensor({37, 29}, 5, 3.0f);
  Tensor y = Tensor::empty({37 * 29}, DType::bf16);  // another shape, same element count
  cast_to_bf16(y, x);
  const float* a = x.data<float>();
  const bf16* b = y.data<bf16>();
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(b[i].bits, to_bf16(a[i]).bits) << i;
  // The values a vector conversion could get wrong, in whole 16-element blocks and in the tail:
  // ties both ways, subnormals (which the AVX-512 BF16 instruction reads as zero), ±0, ±inf, NaNs
  // (a signalling one too), the largest float (rounds to inf) and the smallest normal.
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000001u, 0x807fffffu, 0x00400000u,
                              0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u,
                              0xffa00000u, 0x7f7fffffu, 0x00800000u, 0x80800000u, 0x3f7fffffu};
  for (int64_t n : {16, 48, 16 * 70 + 7}) {
    Tensor s = Tensor::empty({n}, DType::f32);
    Tensor sb = Tensor::empty({n}, DType::bf16);
    for (int64_t i = 0; i < n; ++i) {
      // Special values in every other block (the rest normal), and all of them in the tail.
      const bool special_here = (i / 16) % 2 == 1 || i >= n - 7;
      s.data<float>()[i] = special_here ? std::bit_cast<float>(special[i % std::size(special)])
                                        : 1.0f + static_cast<float>(i) / 3.0f;
    }
    cast_to_bf16(sb, s);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(sb.data<bf16>()[i].bits, to_bf16(s.data<float>()[i]).bits)
          << "n " << n << " element " << i << " bits 0x" << std::hex
          << std::bit_cast<uint32_t>(s.data<float>()[i]);
  }
  EXPECT_THROW(cast_to_bf16(Tensor::empty({10}, DType::bf16), x), Error);
  EXPECT_THROW(cast_to_bf16(Tensor::empty({37, 29}, DType::f32), x), Error);
}

// Every one of the 65536 bf16 bit patterns, in whole 16-element blocks and a tail: the widening is
// exact (each result's bits are the source's followed by 16 zeros) and cast_to_bf16 gives the source
// back, a signalling NaN coming back quiet as to_bf16 makes it. Tolerance 0: both are exact.
TEST(CastToF32, WidensExactlyAndCastToBf16GivesTheSourceBack) {
  const int64_t n = 65536 + 8;  // the last 8 repeat patterns 0..7, in a tail shorter than 16
  Tensor src = Tensor::empty({n}, DType::bf16);
  for (int64_t i = 0; i < n; ++i) src.data<bf16>()[i].bits = static_cast<uint16_t>(i & 0xffff);
  Tensor wide = random_tensor({8, n / 8}, 41);  // another shape, same element count; garbage: written
  cast_to_f32(wide, src);
  Tensor back = Tensor::empty({n}, DType::bf16);
  cast_to_bf16(back, wide);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = src.data<bf16>()[i].bits;
    ASSERT_EQ(std::bit_cast<uint32_t>(wide.data<float>()[i]), uint32_t{b} << 16) << std::hex << "bits 0x" << b;
    const bool signalling_nan = (b & 0x7fffu) > 0x7f80u && (b & 0x0040u) == 0;
    ASSERT_EQ(back.data<bf16>()[i].bits, signalling_nan ? (b | 0x0040u) : b) << std::hex << "bits 0x" << b;
  }
}

TEST(CastToF32, WrongDtypesAndSizesAreNamed) {
  Tensor src = Tensor::zeros({4, 6}, DType::bf16);
  EXPECT_EQ(test::error_of([&] { cast_to_f32(Tensor::empty({24}, DType::f32), Tensor::zeros({24}, DType::f32)); }),
            "cast_to_f32: src must be bf16, found f32[24] cpu");
  EXPECT_EQ(test::error_of([&] { cast_to_f32(Tensor::empty({24}, DType::bf16), src); }),
            "cast_to_f32: dst must be f32, found bf16[24] cpu");
  EXPECT_EQ(test::error_of([&] { cast_to_f32(Tensor::empty({5, 5}, DType::f32), src); }),
            "cast_to_f32: dst f32[5, 5] cpu must have as many elements as src bf16[4, 6] cpu");
  EXPECT_NE(test::error_of([&] { cast_to_f32(Tensor::empty({24}, DType::f32), Tensor{}); }).find("cast_to_f32: src"),
            std::string::npos);
}

}  // namespace
}  // namespace zaya::ops
