// One test, two devices: the dense, scale-bias and EDA ops on CUDA against the same ops on the CPU
// (the reference, itself tested against float64 in test_dense.cc and test_router_state.cc), from
// the same random inputs; outputs and every gradient compared, and the device's reductions checked
// bitwise run to run. Skipped with a message where no GPU is present (docs/cuda.md says how to run
// them on one: scripts/gpu_check.sh).
//
// Tolerances are norm-wise relative errors ||cuda − cpu|| / ||cpu||, fp32 on both devices:
// - kFewTerms = 1e-5: elementwise ops and per-row math of a few terms. The devices differ by the
//   exp/erf implementations (CUDA's expf/erff ≤ 2 ulp, the CPU's expf_fast/erf_fast ~1 ulp) and by
//   nvcc contracting a·b + c into one FMA where g++ (ISO C++ mode) rounds twice: a few ulp, ~1e-6.
//   Row reductions (RMSNorm's mean of squares, softmax's sum) add F terms in another order, whose
//   error is ~√F ulp relative for these positive sums: also within 1e-5 for F ≤ 1000.
// - kColumnSums = 1e-4: parameter gradients summed over N rows of random-sign terms. The order is
//   chunked on both devices but the chunk lengths differ (64 rows here; 256 in the CPU's EDA, none
//   in its scale-bias), and a sum whose terms cancel has a relative error up to ~N ulp of its
//   largest term over its size (√N smaller): 1e-4 leaves room for N = 300 rows.
// - exact: copies, gathers and sums in the same order (embedding, its bf16 table too), and the shared
//   bf16 rounding and widening.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/gradcheck.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/router_state.h"
#include "zaya/ops/scale_bias.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

constexpr double kFewTerms = 1e-5;
constexpr double kColumnSums = 1e-4;

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason()

// 300 rows: several of the column sums' 64-row chunks and a partial one; 333 features: not a
// multiple of a warp or a block.
constexpr int64_t N = 300, F = 333;

Tensor on_gpu(const Tensor& host) { return host.to(Device::cuda); }

// ||cuda − cpu|| / ||cpu||, the CUDA tensor copied back first.
double rel_diff(const Tensor& on_cuda, const Tensor& on_cpu) {
  return test::rel_error(on_cuda.to(Device::cpu), test::to_f64(on_cpu));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu), hb = b.to(Device::cpu);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

TEST(DenseCuda, ActivationsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  // Scale 4: both tails of σ and erf, and GELU's dip around −0.75, are exercised.
  Tensor x = random_tensor({N, F}, 1, 4.0f), dy = random_tensor({N, F}, 2);
  Tensor xg = on_gpu(x), dyg = on_gpu(dy);
  struct Act {
    const char* name;
    void (*fwd)(const Tensor&, const Tensor&);
    void (*bwd)(const Tensor&, const Tensor&, const Tensor&);
  };
  for (const Act& a : {Act{"silu", silu_forward, silu_backward}, Act{"gelu", gelu_forward, gelu_backward}}) {
    Tensor y = Tensor::empty({N, F}, DType::f32), yg = Tensor::empty({N, F}, DType::f32, Device::cuda);
    a.fwd(y, x);
    a.fwd(yg, xg);
    EXPECT_LT(rel_diff(yg, y), kFewTerms) << a.name;
    Tensor dx = Tensor::empty({N, F}, DType::f32), dxg = Tensor::empty({N, F}, DType::f32, Device::cuda);
    a.bwd(dx, dy, x);
    a.bwd(dxg, dyg, xg);
    EXPECT_LT(rel_diff(dxg, dx), kFewTerms) << a.name;
    // In place (dx == dy), as the model calls it.
    Tensor inplace = dyg.clone();
    a.bwd(inplace, inplace, xg);
    EXPECT_TRUE(bitwise_equal(inplace, dxg)) << a.name;
  }
}

TEST(DenseCuda, SwigluMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t inter = 129;
  Tensor gu = random_tensor({N, 2 * inter}, 3, 3.0f), dy = random_tensor({N, inter}, 4);
  Tensor y = Tensor::empty({N, inter}, DType::f32), yg = Tensor::empty({N, inter}, DType::f32, Device::cuda);
  swiglu_forward(y, gu);
  swiglu_forward(yg, on_gpu(gu));
  EXPECT_LT(rel_diff(yg, y), kFewTerms);
  Tensor dgu = Tensor::empty({N, 2 * inter}, DType::f32), dgug = Tensor::empty({N, 2 * inter}, DType::f32, Device::cuda);
  swiglu_backward(dgu, dy, gu);
  swiglu_backward(dgug, on_gpu(dy), on_gpu(gu));
  EXPECT_LT(rel_diff(dgug, dgu), kFewTerms);
}

TEST(DenseCuda, CastToBf16IsBitwiseTheCpus) {
  SKIP_WITHOUT_GPU();
  // Both devices round with core's to_bf16; ties, an infinity and a NaN included.
  Tensor x = random_tensor({37, 29}, 5, 3.0f);
  float* p = x.data<float>();
  p[0] = 1.00390625f;  // halfway between two bf16 values: ties to even
  p[1] = INFINITY;
  p[2] = NAN;
  Tensor b = Tensor::empty({37 * 29}, DType::bf16), bg = Tensor::empty({37 * 29}, DType::bf16, Device::cuda);
  cast_to_bf16(b, x);
  cast_to_bf16(bg, on_gpu(x));
  EXPECT_TRUE(bitwise_equal(bg, b));
}

TEST(DenseCuda, RmsnormMatchesTheCpuAndItsWeightGradientIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Tensor x = random_tensor({N, F}, 6, 2.0f), w = random_tensor({F}, 7), dy = random_tensor({N, F}, 8);
  Tensor y = Tensor::empty({N, F}, DType::f32), rstd = Tensor::empty({N}, DType::f32);
  rmsnorm_forward(y, rstd, x, w, 1e-6f);
  Tensor xg = on_gpu(x), wg = on_gpu(w), dyg = on_gpu(dy);
  Tensor yg = Tensor::empty({N, F}, DType::f32, Device::cuda), rg = Tensor::empty({N}, DType::f32, Device::cuda);
  rmsnorm_forward(yg, rg, xg, wg, 1e-6f);
  EXPECT_LT(rel_diff(yg, y), kFewTerms);
  EXPECT_LT(rel_diff(rg, rstd), kFewTerms);

  // dx accumulated onto a non-zero start, dw onto a non-zero start (gradients accumulate).
  Tensor dx0 = random_tensor({N, F}, 9), dw0 = random_tensor({F}, 10);
  Tensor dx = dx0.clone(), dw = dw0.clone();
  rmsnorm_backward(dx, dw, dy, x, w, rstd, /*accumulate_dx=*/true);
  Tensor dxg = on_gpu(dx0), dwg = on_gpu(dw0);
  rmsnorm_backward(dxg, dwg, dyg, xg, wg, rg, true);
  EXPECT_LT(rel_diff(dxg, dx), kFewTerms);
  EXPECT_LT(rel_diff(dwg, dw), kColumnSums);

  // Written dx, and dw alone; then the same call again: bitwise the same.
  Tensor dxw = Tensor::empty({N, F}, DType::f32);
  rmsnorm_backward(dxw, Tensor{}, dy, x, w, rstd);
  Tensor dxwg = Tensor::empty({N, F}, DType::f32, Device::cuda);
  rmsnorm_backward(dxwg, Tensor{}, dyg, xg, wg, rg);
  EXPECT_LT(rel_diff(dxwg, dxw), kFewTerms);
  Tensor dw_a = on_gpu(dw0), dw_b = on_gpu(dw0);
  rmsnorm_backward(Tensor{}, dw_a, dyg, xg, wg, rg);
  rmsnorm_backward(Tensor{}, dw_b, dyg, xg, wg, rg);
  EXPECT_TRUE(bitwise_equal(dw_a, dw_b));
}

TEST(DenseCuda, ResidualScaleMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Tensor h = random_tensor({N, F}, 11), x = random_tensor({N, F}, 12), dy = random_tensor({N, F}, 13);
  const ResidualScaleParams p{random_tensor({F}, 14), random_tensor({F}, 15), random_tensor({F}, 16),
                              random_tensor({F}, 17)};
  const ResidualScaleParams pg{on_gpu(p.hidden_scale), on_gpu(p.hidden_bias), on_gpu(p.residual_scale),
                               on_gpu(p.residual_bias)};
  Tensor y = Tensor::empty({N, F}, DType::f32), yg = Tensor::empty({N, F}, DType::f32, Device::cuda);
  residual_scale_forward(y, h, x, p);
  residual_scale_forward(yg, on_gpu(h), on_gpu(x), pg);
  EXPECT_LT(rel_diff(yg, y), kFewTerms);

  auto grads_from = [](uint64_t seed, Device d) {
    return ResidualScaleParams{random_tensor({F}, seed).to(d), random_tensor({F}, seed + 1).to(d),
                               random_tensor({F}, seed + 2).to(d), random_tensor({F}, seed + 3).to(d)};
  };
  Tensor dh = Tensor::empty({N, F}, DType::f32), dx = Tensor::empty({N, F}, DType::f32);
  const ResidualScaleParams g = grads_from(20, Device::cpu), gg = grads_from(20, Device::cuda);
  residual_scale_backward(dh, dx, g, dy, h, x, p);
  Tensor dhg = Tensor::empty({N, F}, DType::f32, Device::cuda), dxg = Tensor::empty({N, F}, DType::f32, Device::cuda);
  residual_scale_backward(dhg, dxg, gg, on_gpu(dy), on_gpu(h), on_gpu(x), pg);
  EXPECT_LT(rel_diff(dhg, dh), kFewTerms);
  EXPECT_LT(rel_diff(dxg, dx), kFewTerms);
  EXPECT_LT(rel_diff(gg.hidden_scale, g.hidden_scale), kColumnSums);
  EXPECT_LT(rel_diff(gg.hidden_bias, g.hidden_bias), kColumnSums);
  EXPECT_LT(rel_diff(gg.residual_scale, g.residual_scale), kColumnSums);
  EXPECT_LT(rel_diff(gg.residual_bias, g.residual_bias), kColumnSums);

  // The parameter gradients bitwise run to run (dh, dx undefined: only the sums).
  const ResidualScaleParams a = grads_from(20, Device::cuda), b = grads_from(20, Device::cuda);
  residual_scale_backward(Tensor{}, Tensor{}, a, on_gpu(dy), on_gpu(h), on_gpu(x), pg);
  residual_scale_backward(Tensor{}, Tensor{}, b, on_gpu(dy), on_gpu(h), on_gpu(x), pg);
  EXPECT_TRUE(bitwise_equal(a.hidden_scale, b.hidden_scale) && bitwise_equal(a.hidden_bias, b.hidden_bias) &&
              bitwise_equal(a.residual_scale, b.residual_scale) && bitwise_equal(a.residual_bias, b.residual_bias));
}

// The backward on a bf16 h (the model's bf16 saved o and m): against the CPU's bf16-h op with the
// tolerances above (dh, dx: kFewTerms; the column sums: kColumnSums), and bitwise the CUDA op on
// the widened h (the same kernel on the same values: the term reads h widened, exactly).
TEST(DenseCuda, ResidualScaleBackwardOnBf16HMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Tensor h = random_tensor({N, F}, 41), x = random_tensor({N, F}, 42), dy = random_tensor({N, F}, 43);
  Tensor h16 = Tensor::empty({N, F}, DType::bf16), widened = Tensor::empty({N, F}, DType::f32);
  cast_to_bf16(h16, h);
  cast_to_f32(widened, h16);
  const ResidualScaleParams p{random_tensor({F}, 44), random_tensor({F}, 45), random_tensor({F}, 46),
                              random_tensor({F}, 47)};
  const ResidualScaleParams pg{on_gpu(p.hidden_scale), on_gpu(p.hidden_bias), on_gpu(p.residual_scale),
                               on_gpu(p.residual_bias)};
  auto grads_from = [](uint64_t seed, Device d) {
    return ResidualScaleParams{random_tensor({F}, seed).to(d), random_tensor({F}, seed + 1).to(d),
                               random_tensor({F}, seed + 2).to(d), random_tensor({F}, seed + 3).to(d)};
  };
  Tensor dh = Tensor::empty({N, F}, DType::f32), dx = Tensor::empty({N, F}, DType::f32);
  const ResidualScaleParams g = grads_from(50, Device::cpu);
  residual_scale_backward(dh, dx, g, dy, h16, x, p);
  Tensor dhg = Tensor::empty({N, F}, DType::f32, Device::cuda), dxg = Tensor::empty({N, F}, DType::f32, Device::cuda);
  const ResidualScaleParams gg = grads_from(50, Device::cuda);
  residual_scale_backward(dhg, dxg, gg, on_gpu(dy), on_gpu(h16), on_gpu(x), pg);
  EXPECT_LT(rel_diff(dhg, dh), kFewTerms);
  EXPECT_LT(rel_diff(dxg, dx), kFewTerms);
  EXPECT_LT(rel_diff(gg.hidden_scale, g.hidden_scale), kColumnSums);
  EXPECT_LT(rel_diff(gg.hidden_bias, g.hidden_bias), kColumnSums);
  EXPECT_LT(rel_diff(gg.residual_scale, g.residual_scale), kColumnSums);
  EXPECT_LT(rel_diff(gg.residual_bias, g.residual_bias), kColumnSums);

  Tensor dhw = Tensor::empty({N, F}, DType::f32, Device::cuda), dxw = Tensor::empty({N, F}, DType::f32, Device::cuda);
  const ResidualScaleParams gw = grads_from(50, Device::cuda);
  residual_scale_backward(dhw, dxw, gw, on_gpu(dy), on_gpu(widened), on_gpu(x), pg);
  EXPECT_TRUE(bitwise_equal(dhw, dhg) && bitwise_equal(dxw, dxg));
  EXPECT_TRUE(bitwise_equal(gw.hidden_scale, gg.hidden_scale) && bitwise_equal(gw.hidden_bias, gg.hidden_bias) &&
              bitwise_equal(gw.residual_scale, gg.residual_scale) && bitwise_equal(gw.residual_bias, gg.residual_bias));
}

TEST(DenseCuda, EmbeddingMatchesTheCpuExactlyWithPaddingAndRepeatedIds) {
  SKIP_WITHOUT_GPU();
  const int64_t vocab = 17, n = 200;
  Tensor ids = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % vocab);  // repeats
  Tensor E = random_tensor({vocab, F}, 21), dy = random_tensor({n, F}, 22);
  Tensor y = Tensor::empty({n, F}, DType::f32), yg = Tensor::empty({n, F}, DType::f32, Device::cuda);
  embedding_forward(y, ids, E);
  embedding_forward(yg, on_gpu(ids), on_gpu(E));
  EXPECT_TRUE(bitwise_equal(yg, y));  // a gather
  // Per column, the tokens in order on both devices: the same sums bit for bit.
  for (int64_t pad : {int64_t{-1}, int64_t{3}}) {
    Tensor dE0 = random_tensor({vocab, F}, 23);
    Tensor dE = dE0.clone(), dEg = on_gpu(dE0);
    embedding_backward(dE, dy, ids, pad);
    embedding_backward(dEg, on_gpu(dy), on_gpu(ids), pad);
    EXPECT_TRUE(bitwise_equal(dEg, dE)) << "padding_idx " << pad;
  }
}

TEST(DenseCuda, EmbeddingWithABf16TableIsBitwiseTheCpus) {
  SKIP_WITHOUT_GPU();
  // A gather and core's exact widening on both devices: the same bits. A NaN and an infinity included.
  const int64_t vocab = 17, n = 200;
  Tensor ids = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % vocab);  // repeats
  Tensor E16 = random_tensor({vocab, F}, 26, 2.0f, DType::bf16);
  E16.data<bf16>()[3].bits = 0x7fc1;
  E16.data<bf16>()[F + 5].bits = 0xff80;
  Tensor y = Tensor::empty({n, F}, DType::f32), yg = Tensor::empty({n, F}, DType::f32, Device::cuda);
  embedding_forward(y, ids, E16);
  embedding_forward(yg, on_gpu(ids), on_gpu(E16));
  EXPECT_TRUE(bitwise_equal(yg, y));
}

TEST(DenseCuda, CastToF32IsBitwiseTheCpus) {
  SKIP_WITHOUT_GPU();
  // Every bf16 bit pattern; both devices shift the bits (core's to_float): the same bits.
  const int64_t n = 65536;
  Tensor src = Tensor::empty({n}, DType::bf16);
  for (int64_t i = 0; i < n; ++i) src.data<bf16>()[i].bits = static_cast<uint16_t>(i);
  Tensor dst = Tensor::empty({256, 256}, DType::f32), dst_g = Tensor::empty({256, 256}, DType::f32, Device::cuda);
  cast_to_f32(dst, src);
  cast_to_f32(dst_g, on_gpu(src));
  EXPECT_TRUE(bitwise_equal(dst_g, dst));
}

TEST(DenseCuda, EmbeddingIdOutsideTheVocabularyGivesANanRow) {
  SKIP_WITHOUT_GPU();
  // The CPU throws naming the id; a kernel cannot, so the row is NaN (the loss shows it) and the
  // backward skips it.
  const int64_t vocab = 5, h = 8;
  Tensor ids = Tensor::zeros({3}, DType::i32);
  ids.data<int32_t>()[1] = 7;
  Tensor E = random_tensor({vocab, h}, 24);
  Tensor yg = Tensor::empty({3, h}, DType::f32, Device::cuda);
  embedding_forward(yg, on_gpu(ids), on_gpu(E));
  Tensor y = yg.to(Device::cpu);
  for (int64_t j = 0; j < h; ++j) {
    EXPECT_EQ(y.data<float>()[j], E.data<float>()[j]);
    EXPECT_TRUE(std::isnan(y.data<float>()[h + j]));
  }
  Tensor dEg = Tensor::zeros({vocab, h}, DType::f32, Device::cuda);
  embedding_backward(dEg, on_gpu(random_tensor({3, h}, 25)), on_gpu(ids));
  for (double v : test::to_f64(dEg.to(Device::cpu))) EXPECT_TRUE(std::isfinite(v));
}

TEST(DenseCuda, SoftmaxMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  // 1000 columns: more than one block of threads per row; logits spread ±20.
  const int64_t n = 37, f = 1000;
  Tensor x = random_tensor({n, f}, 26, 20.0f), dy = random_tensor({n, f}, 27);
  Tensor y = Tensor::empty({n, f}, DType::f32), yg = Tensor::empty({n, f}, DType::f32, Device::cuda);
  softmax_forward(y, x);
  softmax_forward(yg, on_gpu(x));
  EXPECT_LT(rel_diff(yg, y), kFewTerms);
  Tensor dx = Tensor::empty({n, f}, DType::f32), dxg = Tensor::empty({n, f}, DType::f32, Device::cuda);
  softmax_backward(dx, dy, y);
  softmax_backward(dxg, on_gpu(dy), on_gpu(y));  // the CPU's y: only the backward's own error
  EXPECT_LT(rel_diff(dxg, dx), kFewTerms);
  Tensor inplace = on_gpu(dy);
  softmax_backward(inplace, inplace, on_gpu(y));
  EXPECT_TRUE(bitwise_equal(inplace, dxg));
}

TEST(ScaleBiasCuda, MatchesTheCpuAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Tensor x = random_tensor({N, F}, 30), b = random_tensor({F}, 31), g = random_tensor({F}, 32);
  Tensor dy = random_tensor({N, F}, 33), db0 = random_tensor({F}, 34), dg0 = random_tensor({F}, 35);
  Tensor y = Tensor::empty({N, F}, DType::f32), yg = Tensor::empty({N, F}, DType::f32, Device::cuda);
  scale_bias_forward(y, x, b, g);
  scale_bias_forward(yg, on_gpu(x), on_gpu(b), on_gpu(g));
  EXPECT_LT(rel_diff(yg, y), kFewTerms);
  Tensor dx = Tensor::empty({N, F}, DType::f32), db = db0.clone(), dg = dg0.clone();
  scale_bias_backward(dx, db, dg, dy, x, b, g);
  Tensor dxg = Tensor::empty({N, F}, DType::f32, Device::cuda), dbg = on_gpu(db0), dgg = on_gpu(dg0);
  scale_bias_backward(dxg, dbg, dgg, on_gpu(dy), on_gpu(x), on_gpu(b), on_gpu(g));
  EXPECT_LT(rel_diff(dxg, dx), kFewTerms);
  EXPECT_LT(rel_diff(dbg, db), kColumnSums);
  EXPECT_LT(rel_diff(dgg, dg), kColumnSums);
  Tensor dbg2 = on_gpu(db0), dgg2 = on_gpu(dg0);
  scale_bias_backward(dxg, dbg2, dgg2, on_gpu(dy), on_gpu(x), on_gpu(b), on_gpu(g));
  EXPECT_TRUE(bitwise_equal(dbg2, dbg) && bitwise_equal(dgg2, dgg));
}

TEST(EdaCuda, MatchesTheCpuWithAndWithoutEdaAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const int64_t R = 6;  // the router's width in ZAYA1's reduced configs: narrower than a warp
  Tensor h = random_tensor({N, R}, 40), r_prev = random_tensor({N, R}, 41), s = random_tensor({R}, 42);
  Tensor r = h.clone(), rg = on_gpu(h);
  eda_forward(r, r_prev, s);
  eda_forward(rg, on_gpu(r_prev), on_gpu(s));
  EXPECT_LT(rel_diff(rg, r), kFewTerms);

  Tensor dr0 = random_tensor({N, R}, 43), c0 = random_tensor({N, R}, 44), ds0 = random_tensor({R}, 45);
  Tensor dr = dr0.clone(), c = c0.clone(), ds = ds0.clone();
  eda_backward(dr, c, ds, r_prev, s);
  Tensor drg = on_gpu(dr0), cg = on_gpu(c0), dsg = on_gpu(ds0);
  eda_backward(drg, cg, dsg, on_gpu(r_prev), on_gpu(s));
  EXPECT_TRUE(bitwise_equal(drg, dr));  // one addition per element
  EXPECT_LT(rel_diff(cg, c), kFewTerms);
  EXPECT_LT(rel_diff(dsg, ds), kColumnSums);
  Tensor drg2 = on_gpu(dr0), cg2 = on_gpu(c0), dsg2 = on_gpu(ds0);
  eda_backward(drg2, cg2, dsg2, on_gpu(r_prev), on_gpu(s));
  EXPECT_TRUE(bitwise_equal(dsg2, dsg));

  // Layer 0: no EDA, the carry only read.
  Tensor dr_0 = dr0.clone(), dr_0g = on_gpu(dr0), cg0 = on_gpu(c0);
  eda_backward(dr_0, c0, Tensor{}, Tensor{}, Tensor{});
  eda_backward(dr_0g, cg0, Tensor{}, Tensor{}, Tensor{});
  EXPECT_TRUE(bitwise_equal(dr_0g, dr_0));
  EXPECT_TRUE(bitwise_equal(cg0, c0));
}

}  // namespace
}  // namespace zaya::ops
