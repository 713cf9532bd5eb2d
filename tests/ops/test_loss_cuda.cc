// One test, two devices: the cross-entropy ops on CUDA against the same ops on the CPU (the
// reference, itself tested against float64 in test_loss.cc), from the same random inputs. Skipped
// with a message where no GPU is present (docs/cuda.md: scripts/gpu_check.sh runs them on one).
// The tied head's CUDA path makes its logits with ops::gemm; in a build whose ops::gemm has no
// CUDA kernel yet, those tests skip saying so (the row kernels are still tested through the
// materialized-logits ops, which use no GEMM).
//
// Tolerances (fp32 on both devices; norm-wise relative errors unless said otherwise):
// - lse and the loss, 1e-6: a row's Σexp over up to V = 1000 positive terms in another order
//   (block sums against 16 lanes) and CUDA's expf/logf (≤ 2 ulp) against the CPU's expf_fast: a
//   relative error of a few ulp·√V on Σ, which is an absolute one on lse (≥ log V ≈ 7 here).
// - the logits gradient, 1e-5: each element exp(logit − lse)/count, so lse's error (above, as an
//   absolute error ~1e-6) and exp's few ulp carry into it relatively.
// - the tied head's dh and dE, 1e-4: those gradients, then GEMMs over V (dh) or N (dE) random-sign
//   terms in another order, whose cancellation amplifies the relative error (as kColumnSums in
//   test_dense_cuda.cc). This assumes fp32 GEMMs (fp32 compute, no TF32) on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cuda_compare.h"
#include "ops/loss_reference.h"
#include "test_util.h"
#include "zaya/ops/loss.h"

namespace zaya::ops {
namespace {

using loss_test::make_targets;
using test::bitwise_equal;
using test::gpu_empty;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr int64_t kRows = 61, kVocab = 1000;

// Targets over [0, kVocab) with every 9th row ignored, the first and last columns included.
Tensor targets_for(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 9 == 4 ? -100 : static_cast<int32_t>((i * 389) % vocab);
  t[0] = 0;
  t[n - 1] = static_cast<int32_t>(vocab - 1);
  return make_targets(t);
}

TEST(CrossEntropyCuda, LogitsForwardAndBackwardMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  // Logits spread ±40: probabilities over many orders of magnitude, some below the 2^-100 flush.
  Tensor logits = random_tensor({kRows, kVocab}, 51, 40.0f), tg = targets_for(kRows, kVocab);
  Tensor logits_g = on_gpu(logits), tg_g = on_gpu(tg);
  Tensor lse = Tensor::empty({kRows}, DType::f32), lse_g = gpu_empty({kRows});
  const CrossEntropyResult r = cross_entropy_logits_forward(lse, logits, tg);
  const CrossEntropyResult rg = cross_entropy_logits_forward(lse_g, logits_g, tg_g);
  EXPECT_EQ(rg.count, r.count);
  EXPECT_NEAR(rg.loss, r.loss, 1e-6 * std::fabs(r.loss));
  EXPECT_LT(rel_diff(lse_g, lse), 1e-6);
  EXPECT_TRUE(bitwise_equal(logits_g, logits));  // the forward leaves the logits as they are

  cross_entropy_logits_backward(logits, lse, tg, r.count);
  cross_entropy_logits_backward(logits_g, on_gpu(lse), tg_g,
                                r.count);  // the CPU's lse: the backward's own error
  EXPECT_LT(rel_diff(logits_g, logits), 1e-5);
  const Tensor g = logits_g.to(Device::cpu);
  for (int64_t j = 0; j < kVocab; ++j) EXPECT_EQ(g.data<float>()[4 * kVocab + j], 0.0f);  // an ignored row
}

TEST(CrossEntropyCuda, ABadTargetIsNamedWithItsRow) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor logits = random_tensor({kRows, kVocab}, 52), tg = targets_for(kRows, kVocab);
  tg.data<int32_t>()[17] = static_cast<int32_t>(kVocab);
  tg.data<int32_t>()[30] = -5;
  Tensor lse_g = gpu_empty({kRows});
  const std::string msg =
      test::error_of([&] { cross_entropy_logits_forward(lse_g, on_gpu(logits), on_gpu(tg)); });
  EXPECT_NE(msg.find("cross_entropy_logits_forward: target 1000 at row 17 is outside [0, 1000)"),
            std::string::npos)
      << msg;
}

// The tied head for chunkings that do and do not divide V, and one chunk covering V (the CUDA path
// then reuses the forward's logits instead of making them again).
TEST(CrossEntropyCuda, TiedHeadMatchesTheCpuForEveryChunking) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t hd = 40;
  Tensor h = random_tensor({kRows, hd}, 53, 0.5f), E = random_tensor({kVocab, hd}, 54, 0.5f);
  Tensor tg = targets_for(kRows, kVocab), h_g = on_gpu(h), E_g = on_gpu(E), tg_g = on_gpu(tg);
  for (int64_t chunk : {int64_t{256}, int64_t{250}, int64_t{4096}}) {
    SCOPED_TRACE(chunk);
    const CrossEntropyOptions opt{.chunk = chunk};
    const int64_t ws_elems = cross_entropy_workspace_elems(kRows, kVocab, opt);
    Tensor ws = Tensor::empty({ws_elems}, DType::f32), ws_g = gpu_empty({ws_elems});
    Tensor lse = Tensor::empty({kRows}, DType::f32), lse_g = gpu_empty({kRows});
    const CrossEntropyResult f = cross_entropy_tied_forward(lse, h, E, tg, ws, opt);
    const CrossEntropyResult fg = cross_entropy_tied_forward(lse_g, h_g, E_g, tg_g, ws_g, opt);
    EXPECT_EQ(fg.count, f.count);
    EXPECT_NEAR(fg.loss, f.loss, 1e-6 * std::fabs(f.loss));
    EXPECT_LT(rel_diff(lse_g, lse), 1e-6);

    // dh written over garbage, dE accumulated onto a non-zero start.
    Tensor dE0 = random_tensor({kVocab, hd}, 55);
    Tensor dh = random_tensor({kRows, hd}, 56), dE = dE0.clone();
    Tensor dh_g = on_gpu(dh), dE_g = on_gpu(dE0);
    const CrossEntropyResult b = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
    const CrossEntropyResult bg =
        cross_entropy_tied_forward_backward(dh_g, dE_g, lse_g, h_g, E_g, tg_g, ws_g, opt);
    EXPECT_EQ(bg.loss, fg.loss);  // the same forward, bitwise
    EXPECT_EQ(b.count, bg.count);
    EXPECT_LT(rel_diff(dh_g, dh), 1e-4);
    // dE's change, not dE: the start would hide the gradient's error.
    std::vector<double> de = test::to_f64(dE), de_g = test::to_f64(dE_g.to(Device::cpu)),
                        d0 = test::to_f64(dE0);
    for (size_t i = 0; i < de.size(); ++i) de[i] -= d0[i], de_g[i] -= d0[i];
    EXPECT_LT(test::rel_error(de_g, de), 1e-4);
  }
}

// The tied head with bf16 GEMM inputs, chunked and with one chunk. Loss and lse as the f32 head's
// (the bf16 products are exact in f32 on both devices, which accumulate in f32). dh and dE: each
// device rounds its own G to bf16, and where the two G differ in their last f32 bits a rounding may
// go the other way: at most one bf16 ulp (2^-8 relative) on some elements, so 2^-8 bounds the
// norm-wise difference even if every element flipped, plus the f32 head's 1e-4 for the rest.
TEST(CrossEntropyCuda, TiedHeadWithBf16InputsMatchesTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t hd = 40;
  Tensor h16 = random_tensor({kRows, hd}, 61, 0.5f, DType::bf16);
  Tensor E16 = random_tensor({kVocab, hd}, 62, 0.5f, DType::bf16);
  Tensor tg = targets_for(kRows, kVocab), h_g = on_gpu(h16), E_g = on_gpu(E16), tg_g = on_gpu(tg);
  for (int64_t chunk : {int64_t{256}, int64_t{4096}}) {
    SCOPED_TRACE(chunk);
    const CrossEntropyOptions opt{.chunk = chunk};
    const int64_t ws_elems = cross_entropy_workspace_elems(kRows, kVocab, opt);
    const int64_t g_elems = kRows * std::min(chunk, kVocab);
    Tensor ws = Tensor::empty({ws_elems}, DType::f32), ws_g = gpu_empty({ws_elems});
    Tensor g16 = Tensor::empty({g_elems}, DType::bf16), g16_g = gpu_empty({g_elems}, DType::bf16);
    Tensor lse = Tensor::empty({kRows}, DType::f32), lse_g = gpu_empty({kRows});
    Tensor dE0 = random_tensor({kVocab, hd}, 63);
    Tensor dh = random_tensor({kRows, hd}, 64), dE = dE0.clone();
    Tensor dh_g = on_gpu(dh), dE_g = on_gpu(dE0);
    const CrossEntropyResult r =
        cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, tg, ws, g16, opt);
    const CrossEntropyResult rg =
        cross_entropy_tied_forward_backward_bf16(dh_g, dE_g, lse_g, h_g, E_g, tg_g, ws_g, g16_g, opt);
    EXPECT_EQ(rg.count, r.count);
    EXPECT_NEAR(rg.loss, r.loss, 1e-6 * std::fabs(r.loss));
    EXPECT_LT(rel_diff(lse_g, lse), 1e-6);
    constexpr double kTol = 1.0 / 256 + 1e-4;
    EXPECT_LT(rel_diff(dh_g, dh), kTol);
    std::vector<double> de = test::to_f64(dE), de_g = test::to_f64(dE_g.to(Device::cpu)),
                        d0 = test::to_f64(dE0);
    for (size_t i = 0; i < de.size(); ++i) de[i] -= d0[i], de_g[i] -= d0[i];
    EXPECT_LT(test::rel_error(de_g, de), kTol);
  }
}

// The bf16 head's forward alone: on the device bitwise the device's forward-backward (the same
// kernels on the same inputs: tolerance 0), and against the CPU's forward alone the f32 head's
// bounds for the loss and lse (bf16 products exact in f32, both devices accumulate in f32). Chunks
// that divide V, that do not, and one covering it; ignored rows included (targets_for).
TEST(CrossEntropyCuda, Bf16ForwardAloneIsItsForwardBackwardsAndMatchesTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t hd = 40;
  Tensor h16 = random_tensor({kRows, hd}, 65, 0.5f, DType::bf16);
  Tensor E16 = random_tensor({kVocab, hd}, 66, 0.5f, DType::bf16);
  Tensor tg = targets_for(kRows, kVocab), h_g = on_gpu(h16), E_g = on_gpu(E16), tg_g = on_gpu(tg);
  for (int64_t chunk : {int64_t{250}, int64_t{256}, int64_t{4096}}) {
    SCOPED_TRACE(chunk);
    const CrossEntropyOptions opt{.chunk = chunk};
    const int64_t ws_elems = cross_entropy_workspace_elems(kRows, kVocab, opt);
    Tensor ws = Tensor::empty({ws_elems}, DType::f32), ws_g = gpu_empty({ws_elems});
    Tensor lse = Tensor::empty({kRows}, DType::f32), lse_g = gpu_empty({kRows}), lse_fb = gpu_empty({kRows});
    const CrossEntropyResult f = cross_entropy_tied_forward_bf16(lse, h16, E16, tg, ws, opt);
    const CrossEntropyResult fg = cross_entropy_tied_forward_bf16(lse_g, h_g, E_g, tg_g, ws_g, opt);
    EXPECT_EQ(fg.count, f.count);
    EXPECT_NEAR(fg.loss, f.loss, 1e-6 * std::fabs(f.loss));
    EXPECT_LT(rel_diff(lse_g, lse), 1e-6);

    Tensor g16 = gpu_empty({kRows * std::min(chunk, kVocab)}, DType::bf16);
    Tensor dh = gpu_empty({kRows, hd}), dE = on_gpu(Tensor::zeros({kVocab, hd}, DType::f32));
    const CrossEntropyResult fb =
        cross_entropy_tied_forward_backward_bf16(dh, dE, lse_fb, h_g, E_g, tg_g, ws_g, g16, opt);
    EXPECT_EQ(fb.count, fg.count);
    EXPECT_EQ(fb.loss, fg.loss);
    EXPECT_TRUE(bitwise_equal(lse_fb, lse_g));
  }
}

TEST(CrossEntropyCuda, TiedHeadWithEveryTargetIgnoredZeroesDhAndLeavesDe) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t n = 5, hd = 8, vocab = 33;
  const CrossEntropyOptions opt{.chunk = 16};
  Tensor h = on_gpu(random_tensor({n, hd}, 57)), E = on_gpu(random_tensor({vocab, hd}, 58));
  Tensor tg = on_gpu(make_targets(std::vector<int32_t>(n, -100)));
  Tensor ws = gpu_empty({cross_entropy_workspace_elems(n, vocab, opt)}), lse = gpu_empty({n});
  Tensor dh = on_gpu(random_tensor({n, hd}, 59)), dE0 = random_tensor({vocab, hd}, 60), dE = on_gpu(dE0);
  const CrossEntropyResult r = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.loss, 0.0);
  for (double v : test::to_f64(dh.to(Device::cpu))) EXPECT_EQ(v, 0.0);
  EXPECT_TRUE(bitwise_equal(dE, dE0));
}

}  // namespace
}  // namespace zaya::ops
