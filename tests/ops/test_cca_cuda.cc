// One test, two devices: the CCA ops on CUDA against the same ops on the CPU (the reference, tested
// against float64 and finite differences in test_cca.cc), from the same random inputs; outputs and
// every gradient compared, accumulating gradients started from non-zero values. Skipped with a
// message where no GPU is present (docs/cuda.md: scripts/gpu_check.sh runs them on one).
//
// Tolerances (norm-wise relative, fp32 on both devices):
// - bitwise: the mean skip, the value shift and the decode states: the same float operations in the
//   same order (sequence_math.h's functions, whose host side test_sequence_math.cc checks against
//   the CPU op), or copies.
// - kFewTerms = 1e-5: the grouped convolution's outputs and its input gradient (dots of 2·hd and
//   hd terms summed in order on the GPU, in 16 interleaved partial sums on the CPU: a few ulp of the
//   terms' size, ~1e-6 relative for these random-sign sums of ≤ 64 terms), the QK norm (a norm of
//   hd terms in another order: an ulp or two of the scale) and the fused q/k path built of them.
// - kColumnSums = 1e-4: parameter gradients summed over all tokens (the conv weights and biases, the
//   key temperature) in 64-row chunks on the GPU and per batch row or in 256-row chunks on the
//   CPU; random-sign sums of ~300 terms whose cancellation amplifies the relative error.
#include <gtest/gtest.h>

#include "ops/cuda_compare.h"
#include "zaya/ops/cca.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::gpu_empty;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr double kFewTerms = 1e-5;
constexpr double kColumnSums = 1e-4;

// 4 query heads in 2 kv groups of head_dim 24 (not a multiple of a warp); 2 batch rows of 150
// tokens: several 64-row chunks and a partial one.
const CcaDims kDims{4, 2, 24};
constexpr int64_t B = 2, T = 150, N = B * T;

CcaConvWeights random_conv_weights(uint64_t seed, float scale) {
  const int64_t C = kDims.channels();
  return {random_tensor({C, 1, 2}, seed, scale), random_tensor({C}, seed + 1, scale),
          random_tensor({C, kDims.hd, 2}, seed + 2, scale / 4), random_tensor({C}, seed + 3, scale)};
}
CcaConvWeights to_gpu(const CcaConvWeights& w) {
  return {on_gpu(w.dw_weight), on_gpu(w.dw_bias), on_gpu(w.gw_weight), on_gpu(w.gw_bias)};
}
CcaConvWeights clone(const CcaConvWeights& w) {
  return {w.dw_weight.clone(), w.dw_bias.clone(), w.gw_weight.clone(), w.gw_bias.clone()};
}

TEST(CcaCuda, ConvolutionForwardBackwardAndDecodeMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t C = kDims.channels();
  const CcaConvWeights w = random_conv_weights(10, 0.5f), wg = to_gpu(w);
  Tensor z = random_tensor({B, T, C}, 1), dout = random_tensor({B, T, C}, 2);
  Tensor out = Tensor::empty({B, T, C}, DType::f32), outg = gpu_empty({B, T, C});
  cca_conv_forward(out, z, w, B, T, kDims);
  cca_conv_forward(outg, on_gpu(z), wg, B, T, kDims);
  EXPECT_LT(rel_diff(outg, out), kFewTerms);

  // Weight gradients accumulate onto non-zero values; dz accumulated onto a non-zero start too.
  const CcaConvWeights g0 = random_conv_weights(20, 1.0f);
  CcaConvWeights grads = clone(g0), gradsg = to_gpu(g0);
  Tensor dz0 = random_tensor({B, T, C}, 3);
  Tensor dz = dz0.clone(), dzg = on_gpu(dz0);
  cca_conv_backward(dz, grads, dout, z, w, B, T, kDims, /*accumulate_dz=*/true);
  cca_conv_backward(dzg, gradsg, on_gpu(dout), on_gpu(z), wg, B, T, kDims, true);
  EXPECT_LT(rel_diff(dzg, dz), kFewTerms);
  EXPECT_LT(rel_diff(gradsg.dw_weight, grads.dw_weight), kColumnSums);
  EXPECT_LT(rel_diff(gradsg.dw_bias, grads.dw_bias), kColumnSums);
  EXPECT_LT(rel_diff(gradsg.gw_weight, grads.gw_weight), kColumnSums);
  EXPECT_LT(rel_diff(gradsg.gw_bias, grads.gw_bias), kColumnSums);

  // Written dz; the device's sums are bitwise the same run to run.
  Tensor dzw = Tensor::empty({B, T, C}, DType::f32), dzwg = gpu_empty({B, T, C});
  CcaConvWeights scratch = clone(g0), scratch_a = to_gpu(g0), scratch_b = to_gpu(g0);
  cca_conv_backward(dzw, scratch, dout, z, w, B, T, kDims);
  cca_conv_backward(dzwg, scratch_a, on_gpu(dout), on_gpu(z), wg, B, T, kDims);
  EXPECT_LT(rel_diff(dzwg, dzw), kFewTerms);
  cca_conv_backward(dzwg, scratch_b, on_gpu(dout), on_gpu(z), wg, B, T, kDims);
  EXPECT_TRUE(bitwise_equal(scratch_a.gw_weight, scratch_b.gw_weight));
  EXPECT_TRUE(bitwise_equal(scratch_a.dw_weight, scratch_b.dw_weight));

  // Decode, token by token from a zero state: each step is the full forward's row at that position
  // (same kernel, same sums: bitwise), and the state holds the CPU's last two inputs.
  Tensor state = Tensor::zeros({B, 2, C}, DType::f32), stateg = on_gpu(state);
  Tensor step = Tensor::empty({B, 1, C}, DType::f32), stepg = gpu_empty({B, 1, C});
  Tensor zt = Tensor::empty({B, 1, C}, DType::f32);
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) zt.data<float>()[b * C + c] = z.data<float>()[(b * T + t) * C + c];
    cca_conv_decode(step, state, zt, w, B, kDims);
    cca_conv_decode(stepg, stateg, on_gpu(zt), wg, B, kDims);
    EXPECT_LT(rel_diff(stepg, step), kFewTerms) << "step " << t;
    Tensor full_row = Tensor::empty({B, 1, C}, DType::f32);
    Tensor outg_host = outg.to(Device::cpu);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        full_row.data<float>()[b * C + c] = outg_host.data<float>()[(b * T + t) * C + c];
    EXPECT_TRUE(bitwise_equal(stepg, full_row)) << "step " << t;
  }
  EXPECT_TRUE(bitwise_equal(stateg, state));
}

TEST(CcaCuda, MeanSkipAndValueShiftAreBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t C = kDims.channels(), rq = kDims.nq * kDims.hd, rk = kDims.nkv * kDims.hd;
  Tensor conv = random_tensor({N, C}, 1), qt = random_tensor({N, rq}, 2), kt = random_tensor({N, rk}, 3);
  Tensor q = Tensor::empty({N, rq}, DType::f32), k = Tensor::empty({N, rk}, DType::f32);
  Tensor qg = gpu_empty({N, rq}), kg = gpu_empty({N, rk});
  mean_skip_forward(q, k, conv, qt, kt, N, kDims);
  mean_skip_forward(qg, kg, on_gpu(conv), on_gpu(qt), on_gpu(kt), N, kDims);
  EXPECT_TRUE(bitwise_equal(qg, q));
  EXPECT_TRUE(bitwise_equal(kg, k));

  Tensor dq = random_tensor({N, rq}, 4), dk = random_tensor({N, rk}, 5);
  Tensor dconv = Tensor::empty({N, C}, DType::f32), dqt = Tensor::empty({N, rq}, DType::f32),
         dkt = Tensor::empty({N, rk}, DType::f32);
  Tensor dconvg = gpu_empty({N, C}), dqtg = gpu_empty({N, rq}), dktg = gpu_empty({N, rk});
  mean_skip_backward(dconv, dqt, dkt, dq, dk, N, kDims);
  mean_skip_backward(dconvg, dqtg, dktg, on_gpu(dq), on_gpu(dk), N, kDims);
  EXPECT_TRUE(bitwise_equal(dconvg, dconv));
  EXPECT_TRUE(bitwise_equal(dqtg, dqt));
  EXPECT_TRUE(bitwise_equal(dktg, dkt));

  const int64_t half = 37;
  Tensor vcd = random_tensor({B, T, 2 * half}, 6), dv = random_tensor({B, T, 2 * half}, 7);
  Tensor v = Tensor::empty({B, T, 2 * half}, DType::f32), vg = gpu_empty({B, T, 2 * half});
  value_shift_forward(v, vcd, B, T, half);
  value_shift_forward(vg, on_gpu(vcd), B, T, half);
  EXPECT_TRUE(bitwise_equal(vg, v));
  Tensor dvcd = Tensor::empty({B, T, 2 * half}, DType::f32), dvcdg = gpu_empty({B, T, 2 * half});
  value_shift_backward(dvcd, dv, B, T, half);
  value_shift_backward(dvcdg, on_gpu(dv), B, T, half);
  EXPECT_TRUE(bitwise_equal(dvcdg, dvcd));

  Tensor state = random_tensor({B, half}, 8), stateg = on_gpu(state);
  Tensor vc = random_tensor({B, 1, half}, 9), vd = random_tensor({B, 1, half}, 10);
  Tensor v1 = Tensor::empty({B, 1, 2 * half}, DType::f32), v1g = gpu_empty({B, 1, 2 * half});
  value_shift_decode(v1, state, vc, vd, B, half);
  value_shift_decode(v1g, stateg, on_gpu(vc), on_gpu(vd), B, half);
  EXPECT_TRUE(bitwise_equal(v1g, v1));
  EXPECT_TRUE(bitwise_equal(stateg, state));
}

TEST(CcaCuda, QkNormMatchesTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t rq = kDims.nq * kDims.hd, rk = kDims.nkv * kDims.hd;
  Tensor q = random_tensor({N, rq}, 1, 3.0f), k = random_tensor({N, rk}, 2, 0.5f);
  // One key row all zeros: its norm is below ε, the constant-scale branch.
  for (int64_t d = 0; d < kDims.hd; ++d) k.data<float>()[7 * rk + d] = 0.0f;
  Tensor temp = random_tensor({kDims.nkv}, 3), dqo = random_tensor({N, rq}, 4), dko = random_tensor({N, rk}, 5);
  Tensor qo = Tensor::empty({N, rq}, DType::f32), ko = Tensor::empty({N, rk}, DType::f32);
  Tensor qog = gpu_empty({N, rq}), kog = gpu_empty({N, rk});
  qk_norm_forward(qo, ko, q, k, temp, N, kDims);
  qk_norm_forward(qog, kog, on_gpu(q), on_gpu(k), on_gpu(temp), N, kDims);
  EXPECT_LT(rel_diff(qog, qo), kFewTerms);
  EXPECT_LT(rel_diff(kog, ko), kFewTerms);

  Tensor dtemp0 = random_tensor({kDims.nkv}, 6);
  Tensor dq = Tensor::empty({N, rq}, DType::f32), dk = Tensor::empty({N, rk}, DType::f32), dtemp = dtemp0.clone();
  Tensor dqg = gpu_empty({N, rq}), dkg = gpu_empty({N, rk}), dtempg = on_gpu(dtemp0);
  qk_norm_backward(dq, dk, dtemp, dqo, dko, q, k, temp, N, kDims);
  qk_norm_backward(dqg, dkg, dtempg, on_gpu(dqo), on_gpu(dko), on_gpu(q), on_gpu(k), on_gpu(temp), N, kDims);
  EXPECT_LT(rel_diff(dqg, dq), kFewTerms);
  // The zero row's gradient (√hd/ε)·τ·dy is ~1e7 times the others': compared on its own.
  const Tensor dk_host = dkg.to(Device::cpu);
  EXPECT_LT(rel_diff(dk_host.slice(0, 7), dk.slice(0, 7)), kFewTerms);
  EXPECT_LT(rel_diff(dk_host.slice(8, N), dk.slice(8, N)), kFewTerms);
  EXPECT_LT(rel_diff(dk_host.slice(7, 8), dk.slice(7, 8)), kFewTerms);
  EXPECT_LT(rel_diff(dtempg, dtemp), kColumnSums);
}

TEST(CcaCuda, FusedQkPathMatchesTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t C = kDims.channels(), rq = kDims.nq * kDims.hd, rk = kDims.nkv * kDims.hd;
  const RopeTable rope = make_rope_table(kDims.hd, 0.5, 1e4, T);
  RopeTable ropeg = rope;
  ropeg.cos = on_gpu(rope.cos);
  ropeg.sin = on_gpu(rope.sin);
  Tensor conv = random_tensor({N, C}, 1), z = random_tensor({N, C}, 2), temp = random_tensor({kDims.nkv}, 3);
  Tensor q = Tensor::empty({N, rq}, DType::f32), k = Tensor::empty({N, rk}, DType::f32);
  Tensor qp = Tensor::empty({N, rq}, DType::f32), kp = Tensor::empty({N, rk}, DType::f32);
  Tensor qg = gpu_empty({N, rq}), kg = gpu_empty({N, rk}), qpg = gpu_empty({N, rq}), kpg = gpu_empty({N, rk});
  cca_qk_forward(q, k, qp, kp, conv, z, temp, rope, B, T, kDims);
  cca_qk_forward(qg, kg, qpg, kpg, on_gpu(conv), on_gpu(z), on_gpu(temp), ropeg, B, T, kDims);
  EXPECT_TRUE(bitwise_equal(qpg, qp));  // the mean skip alone
  EXPECT_TRUE(bitwise_equal(kpg, kp));
  EXPECT_LT(rel_diff(qg, q), kFewTerms);
  EXPECT_LT(rel_diff(kg, k), kFewTerms);

  Tensor dq = random_tensor({N, rq}, 4), dk = random_tensor({N, rk}, 5), dtemp0 = random_tensor({kDims.nkv}, 6);
  Tensor dconv = Tensor::empty({N, C}, DType::f32), dz = Tensor::empty({N, C}, DType::f32), dtemp = dtemp0.clone();
  Tensor dconvg = gpu_empty({N, C}), dzg = gpu_empty({N, C}), dtempg = on_gpu(dtemp0);
  cca_qk_backward(dconv, dz, dtemp, dq, dk, qp, kp, temp, rope, B, T, kDims);
  cca_qk_backward(dconvg, dzg, dtempg, on_gpu(dq), on_gpu(dk), qpg, kpg, on_gpu(temp), ropeg, B, T, kDims);
  EXPECT_LT(rel_diff(dconvg, dconv), kFewTerms);
  EXPECT_LT(rel_diff(dzg, dz), kFewTerms);
  EXPECT_LT(rel_diff(dtempg, dtemp), kColumnSums);
}

}  // namespace
}  // namespace zaya::ops
