// The tied head with bf16 GEMM inputs (cross_entropy_tied_forward_backward_bf16) against the closed
// form in float64 on the same bf16-rounded h and E, for chunkings that do and do not divide V and
// one chunk covering V; with one chunk, bitwise the materialized-logits ops on bf16-made logits
// (what the model's bf16 head was before the op existed); its forward alone
// (cross_entropy_tied_forward_bf16) bitwise its forward; bad arguments named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "device_or_emulated.h"
#include "ops/gradcheck.h"
#include "ops/loss_reference.h"
#include "test_util.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/loss.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;
using loss_test::make_targets;

Tensor to_bf16_copy(const Tensor& f) {
  Tensor b = Tensor::empty(f.shape(), DType::bf16);
  cast_to_bf16(b, f);
  return b;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

constexpr int64_t kRows = 33, kHidden = 64, kVocab = 1000;

std::vector<int32_t> targets() {
  std::vector<int32_t> t(kRows);
  for (int64_t i = 0; i < kRows; ++i) t[i] = i % 5 == 4 ? -100 : static_cast<int32_t>((i * 397) % kVocab);
  t[0] = 0;
  t[kRows - 1] = static_cast<int32_t>(kVocab - 1);
  return t;
}

TEST(CrossEntropyBf16, MatchesTheClosedFormOnTheRoundedInputs) {
  const std::vector<int32_t> t = targets();
  Tensor h = random_tensor({kRows, kHidden}, 71, 0.5f), E = random_tensor({kVocab, kHidden}, 72, 0.5f);
  Tensor h16 = to_bf16_copy(h), E16 = to_bf16_copy(E), tg = make_targets(t);
  // The reference sees the rounded inputs, so only the op's own f32 arithmetic and its rounding of
  // G to bf16 separate the two.
  const Vec hv = to_f64(h16), ev = to_f64(E16);
  Vec lse_ref;
  const double loss_ref = loss_test::ce_reference(hv, ev, t, kRows, kHidden, kVocab, &lse_ref);
  int64_t count = 0;
  for (int32_t x : t) count += x != -100;
  Vec dh_ref(kRows * kHidden, 0.0), de_ref(kVocab * kHidden, 0.0);
  for (int64_t i = 0; i < kRows; ++i) {
    if (t[i] == -100) continue;
    for (int64_t j = 0; j < kVocab; ++j) {
      double l = 0;
      for (int64_t k = 0; k < kHidden; ++k) l += hv[i * kHidden + k] * ev[j * kHidden + k];
      const double g = (std::exp(l - lse_ref[i]) - (j == t[i] ? 1.0 : 0.0)) / static_cast<double>(count);
      for (int64_t k = 0; k < kHidden; ++k) {
        dh_ref[i * kHidden + k] += g * ev[j * kHidden + k];
        de_ref[j * kHidden + k] += g * hv[i * kHidden + k];
      }
    }
  }
  for (int64_t chunk : {int64_t{256}, int64_t{300}, kVocab}) {  // 1000 = 3·256 + 232; 3·300 + 100; one
    SCOPED_TRACE(chunk);
    const CrossEntropyOptions opt{.chunk = chunk};
    Tensor ws = Tensor::empty({cross_entropy_workspace_elems(kRows, kVocab, opt)}, DType::f32);
    Tensor g16 = Tensor::empty({kRows * std::min(chunk, kVocab)}, DType::bf16);
    Tensor lse = Tensor::empty({kRows}, DType::f32);
    Tensor dh = random_tensor({kRows, kHidden}, 73);  // garbage: dh is written, not accumulated
    Tensor dE0 = random_tensor({kVocab, kHidden}, 74), dE = dE0.clone();
    const CrossEntropyResult r =
        cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, tg, ws, g16, opt);
    EXPECT_EQ(r.count, count);
    // bf16 products are exact in f32 and the logits accumulate 64 of them in f32: the f32 op's
    // bounds (test_loss.cc, LargerShapeAgainstAnalyticGradient) hold for the loss and lse.
    EXPECT_NEAR(r.loss, loss_ref, 1e-5 * std::fabs(loss_ref));
    EXPECT_LT(test::rel_error(lse, lse_ref), 1e-6);
    // dh and dE: G is rounded to bf16 (relative error ≤ 2^-9 per element) before the GEMMs, whose
    // sums of random-sign terms carry that as ~2^-9 norm-wise; 2^-7 leaves 4× for the spread.
    // A wrong chunk offset, transpose or a missing chunk is O(1).
    constexpr double kBf16G = 1.0 / 128;
    EXPECT_LT(test::rel_error(dh, dh_ref), kBf16G);
    Vec de = to_f64(dE);
    const Vec d0 = to_f64(dE0);
    for (size_t i = 0; i < de.size(); ++i) de[i] -= d0[i];  // dE accumulated onto its start
    EXPECT_LT(test::rel_error(de, de_ref), kBf16G);
    // Deterministic: the same call again gives the same bits.
    Tensor dh2 = Tensor::empty({kRows, kHidden}, DType::f32), dE2 = dE0.clone();
    const CrossEntropyResult r2 =
        cross_entropy_tied_forward_backward_bf16(dh2, dE2, lse, h16, E16, tg, ws, g16, opt);
    EXPECT_EQ(r2.loss, r.loss);
    EXPECT_TRUE(same_bits(dh2, dh));
    EXPECT_TRUE(same_bits(dE2, dE));
  }
}

// With one chunk covering V the op is, bit for bit, the logits made with bf16 inputs, then
// cross_entropy_logits_forward, cross_entropy_logits_backward, G cast to bf16 and the two GEMMs.
TEST(CrossEntropyBf16, OneChunkIsTheLogitsOpsBitForBit) {
  const std::vector<int32_t> t = targets();
  Tensor h16 = random_tensor({kRows, kHidden}, 75, 0.5f, DType::bf16);
  Tensor E16 = random_tensor({kVocab, kHidden}, 76, 0.5f, DType::bf16), tg = make_targets(t);
  const CrossEntropyOptions opt{.chunk = 8192};
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(kRows, kVocab, opt)}, DType::f32);
  Tensor g16 = Tensor::empty({kRows * kVocab}, DType::bf16), lse = Tensor::empty({kRows}, DType::f32);
  Tensor dh = Tensor::empty({kRows, kHidden}, DType::f32), dE = random_tensor({kVocab, kHidden}, 77);
  Tensor dE_ref = dE.clone();
  const CrossEntropyResult r =
      cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, tg, ws, g16, opt);

  Tensor logits = Tensor::empty({kRows, kVocab}, DType::f32), lse_ref = Tensor::empty({kRows}, DType::f32);
  gemm(logits, h16, Trans::N, E16, Trans::T);
  const CrossEntropyResult rr = cross_entropy_logits_forward(lse_ref, logits, tg);
  cross_entropy_logits_backward(logits, lse_ref, tg, rr.count);
  Tensor g_ref = Tensor::empty({kRows, kVocab}, DType::bf16),
         dh_ref = Tensor::empty({kRows, kHidden}, DType::f32);
  cast_to_bf16(g_ref, logits);
  gemm(dh_ref, g_ref, Trans::N, E16, Trans::N);
  gemm(dE_ref, g_ref, Trans::T, h16, Trans::N, 1.0f, 1.0f);
  EXPECT_EQ(r.loss, rr.loss);
  EXPECT_EQ(r.count, rr.count);
  EXPECT_TRUE(same_bits(lse, lse_ref));
  EXPECT_TRUE(same_bits(dh, dh_ref));
  EXPECT_TRUE(same_bits(dE, dE_ref));
}

TEST(CrossEntropyBf16, EveryTargetIgnoredZeroesDhAndLeavesDe) {
  const int64_t n = 5, hd = 8, v = 33;
  const CrossEntropyOptions opt{.chunk = 16};
  Tensor h16 = random_tensor({n, hd}, 78, 1.0f, DType::bf16),
         E16 = random_tensor({v, hd}, 79, 1.0f, DType::bf16);
  Tensor tg = make_targets(std::vector<int32_t>(n, -100));
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
  Tensor g16 = Tensor::empty({n * 16}, DType::bf16), lse = Tensor::empty({n}, DType::f32);
  Tensor dh = random_tensor({n, hd}, 80), dE = random_tensor({v, hd}, 81), dE0 = dE.clone();
  const CrossEntropyResult r =
      cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, tg, ws, g16, opt);
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.loss, 0.0);
  for (double x : to_f64(dh)) EXPECT_EQ(x, 0.0);
  EXPECT_TRUE(same_bits(dE, dE0));
}

// The forward alone (evaluation with bf16 weights) against the forward-backward's forward: the same
// code path on the same inputs, so the loss, count and lse must agree bit for bit (tolerance 0).
// Shapes: chunks that do and do not divide V (several chunks, the online logsumexp carried across
// them), one chunk covering V (the forward-backward keeps its logits there), one row, a vocabulary
// of one, ignored targets, every target ignored. dh and dE are not compared: this op has none.
TEST(CrossEntropyBf16, ForwardAloneIsTheForwardBackwardsLossAndLseBitwise) {
  struct Case {
    int64_t n, hd, vocab, chunk;
  };
  const Case cases[] = {{kRows, kHidden, kVocab, 256}, {kRows, kHidden, kVocab, 300},
                        {kRows, kHidden, kVocab, kVocab}, {kRows, kHidden, kVocab, 8192},
                        {1, 8, 7, 3}, {17, 24, 50, 16}, {9, 16, 1, 4}};
  uint64_t seed = 90;
  for (const Case& c : cases) {
    for (bool all_ignored : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N " << c.n << " H " << c.hd << " V " << c.vocab << " chunk " << c.chunk
                                      << (all_ignored ? " every target ignored" : ""));
      std::vector<int32_t> t(c.n);
      for (int64_t i = 0; i < c.n; ++i)
        t[i] = all_ignored || (i % 4 == 2) ? -100 : static_cast<int32_t>((i * 389 + 5) % c.vocab);
      if (!all_ignored) t[0] = static_cast<int32_t>(c.vocab - 1);
      Tensor h16 = random_tensor({c.n, c.hd}, ++seed, 0.5f, DType::bf16);
      Tensor E16 = random_tensor({c.vocab, c.hd}, ++seed, 0.5f, DType::bf16), tg = make_targets(t);
      const CrossEntropyOptions opt{.chunk = c.chunk};
      const int64_t ws_elems = cross_entropy_workspace_elems(c.n, c.vocab, opt);
      Tensor ws = random_tensor({ws_elems}, ++seed), lse = random_tensor({c.n}, ++seed);  // garbage in both
      const CrossEntropyResult f = cross_entropy_tied_forward_bf16(lse, h16, E16, tg, ws, opt);

      Tensor ws_fb = Tensor::empty({ws_elems}, DType::f32), lse_fb = Tensor::empty({c.n}, DType::f32);
      Tensor g16 = Tensor::empty({c.n * std::min(c.chunk, c.vocab)}, DType::bf16);
      Tensor dh = Tensor::empty({c.n, c.hd}, DType::f32), dE = Tensor::zeros({c.vocab, c.hd}, DType::f32);
      const CrossEntropyResult fb =
          cross_entropy_tied_forward_backward_bf16(dh, dE, lse_fb, h16, E16, tg, ws_fb, g16, opt);
      EXPECT_EQ(f.count, fb.count);
      EXPECT_EQ(f.loss, fb.loss);
      EXPECT_TRUE(same_bits(lse, lse_fb));
      if (all_ignored) {
        EXPECT_EQ(f.count, 0);
        EXPECT_EQ(f.loss, 0.0);
      } else {
        EXPECT_GT(f.count, 0);
        if (c.vocab > 1) {
          EXPECT_GT(f.loss, 0.1);  // random logits over ≥ 7 columns: far from a sure guess
        }
      }
    }
  }
}

// The forward alone against the closed form on the same bf16 inputs, so that the bitwise agreement
// above cannot hide a forward both ops got wrong. Bounds as in MatchesTheClosedFormOnTheRoundedInputs.
TEST(CrossEntropyBf16, ForwardAloneMatchesTheClosedForm) {
  const std::vector<int32_t> t = targets();
  Tensor h16 = random_tensor({kRows, kHidden}, 97, 0.5f, DType::bf16);
  Tensor E16 = random_tensor({kVocab, kHidden}, 98, 0.5f, DType::bf16), tg = make_targets(t);
  Vec lse_ref;
  const double loss_ref =
      loss_test::ce_reference(to_f64(h16), to_f64(E16), t, kRows, kHidden, kVocab, &lse_ref);
  const CrossEntropyOptions opt{.chunk = 256};
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(kRows, kVocab, opt)}, DType::f32);
  Tensor lse = Tensor::empty({kRows}, DType::f32);
  const CrossEntropyResult r = cross_entropy_tied_forward_bf16(lse, h16, E16, tg, ws, opt);
  EXPECT_NEAR(r.loss, loss_ref, 1e-5 * std::fabs(loss_ref));
  EXPECT_LT(test::rel_error(lse, lse_ref), 1e-6);
}

TEST(CrossEntropyBf16, ForwardAloneBadArgumentsAreNamed) {
  const int64_t n = 4, hd = 8, v = 20;
  const CrossEntropyOptions opt{.chunk = 8};
  Tensor h16 = random_tensor({n, hd}, 84, 1.0f, DType::bf16), E16 = random_tensor({v, hd}, 85, 1.0f, DType::bf16);
  Tensor tg = make_targets({1, 2, 3, 19});
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
  Tensor lse = Tensor::empty({n}, DType::f32);
  auto message = [&](const Tensor& l, const Tensor& h, const Tensor& E, const Tensor& t, const Tensor& w) {
    return test::error_of([&] { cross_entropy_tied_forward_bf16(l, h, E, t, w, opt); });
  };
  EXPECT_EQ(message(lse, random_tensor({n, hd}, 86), E16, tg, ws),
            "cross_entropy_tied_forward_bf16: h16 must be bf16, found f32[4, 8] cpu");
  EXPECT_EQ(message(lse, h16, random_tensor({v, hd}, 87), tg, ws),
            "cross_entropy_tied_forward_bf16: E16 must be bf16, found f32[20, 8] cpu");
  EXPECT_EQ(message(lse, h16, Tensor::zeros({v, hd + 1}, DType::bf16), tg, ws),
            "cross_entropy_tied_forward_bf16: E16 must be [V, 8] to match h16 [4, 8], found [20, 9]");
  EXPECT_EQ(message(Tensor::empty({n}, DType::bf16), h16, E16, tg, ws),
            "cross_entropy_tied_forward_bf16: lse must be f32, found bf16[4] cpu");
  EXPECT_EQ(message(lse, h16, E16, Tensor::zeros({n}, DType::f32), ws),
            "cross_entropy_tied_forward_bf16: targets must be i32, found f32[4] cpu");
  const std::string short_targets = message(lse, h16, E16, make_targets({1, 2, 3}), ws);
  EXPECT_NE(short_targets.find("cross_entropy_tied_forward_bf16: targets"), std::string::npos) << short_targets;
  const std::string small_ws = message(lse, h16, E16, tg, Tensor::empty({5}, DType::f32));
  EXPECT_NE(small_ws.find("cross_entropy_tied_forward_bf16: workspace has 5 elements, needs"), std::string::npos)
      << small_ws;
  EXPECT_EQ(message(lse, h16, E16, make_targets({1, 2, 20, 3}), ws),
            "cross_entropy_tied_forward_bf16: target 20 at row 2 is outside [0, 20) and is not the ignore index -100");
}

// The forward alone on Device::cuda tensors: on a GPU the CUDA kernels, else the emulated device
// (docs/cuda.md), whose front must dispatch it to the CPU kernel. Either way bitwise the device's own
// forward-backward (the same path; tolerance 0). Against the CPU op: emulated, the CPU kernel itself
// (bitwise); on a GPU, test_loss_cuda.cc's bounds for the loss and lse (1e-6: another order of the
// row sums and CUDA's expf/logf).
TEST(CrossEntropyDevice, Bf16ForwardAloneOnTheDeviceIsItsForwardBackwardsAndTheCpus) {
  ZAYA_GPU_OR_EMULATED(real);
  const test::EmulationOffAtExit off{!real};  // other tests of this binary expect no device
  const std::vector<int32_t> t = targets();
  Tensor h16 = random_tensor({kRows, kHidden}, 99, 0.5f, DType::bf16);
  Tensor E16 = random_tensor({kVocab, kHidden}, 100, 0.5f, DType::bf16), tg = make_targets(t);
  const Tensor h_d = h16.to(Device::cuda), E_d = E16.to(Device::cuda), tg_d = tg.to(Device::cuda);
  for (int64_t chunk : {int64_t{300}, kVocab}) {
    SCOPED_TRACE(chunk);
    const CrossEntropyOptions opt{.chunk = chunk};
    const int64_t ws_elems = cross_entropy_workspace_elems(kRows, kVocab, opt);
    Tensor ws = Tensor::empty({ws_elems}, DType::f32), lse = Tensor::empty({kRows}, DType::f32);
    const CrossEntropyResult r = cross_entropy_tied_forward_bf16(lse, h16, E16, tg, ws, opt);
    Tensor ws_d = Tensor::empty({ws_elems}, DType::f32, Device::cuda);
    Tensor lse_d = Tensor::empty({kRows}, DType::f32, Device::cuda);
    const CrossEntropyResult rd = cross_entropy_tied_forward_bf16(lse_d, h_d, E_d, tg_d, ws_d, opt);
    Tensor lse_fb = Tensor::empty({kRows}, DType::f32, Device::cuda);
    Tensor g16 = Tensor::empty({kRows * std::min(chunk, kVocab)}, DType::bf16, Device::cuda);
    Tensor dh = Tensor::empty({kRows, kHidden}, DType::f32, Device::cuda);
    Tensor dE = Tensor::zeros({kVocab, kHidden}, DType::f32, Device::cuda);
    const CrossEntropyResult fb =
        cross_entropy_tied_forward_backward_bf16(dh, dE, lse_fb, h_d, E_d, tg_d, ws_d, g16, opt);
    EXPECT_EQ(rd.count, fb.count);
    EXPECT_EQ(rd.loss, fb.loss);
    EXPECT_TRUE(same_bits(lse_d.to(Device::cpu), lse_fb.to(Device::cpu)));
    EXPECT_EQ(rd.count, r.count);
    if (real) {
      EXPECT_NEAR(rd.loss, r.loss, 1e-6 * std::fabs(r.loss));
      EXPECT_LT(test::rel_error(lse_d.to(Device::cpu), to_f64(lse)), 1e-6);
    } else {
      EXPECT_EQ(rd.loss, r.loss);
      EXPECT_TRUE(same_bits(lse_d.to(Device::cpu), lse));
    }
  }
}

TEST(CrossEntropyBf16, BadArgumentsAreNamed) {
  const int64_t n = 4, hd = 8, v = 20;
  const CrossEntropyOptions opt{.chunk = 8};
  Tensor h = random_tensor({n, hd}, 82), E = random_tensor({v, hd}, 83);
  Tensor h16 = to_bf16_copy(h), E16 = to_bf16_copy(E), tg = make_targets({1, 2, 3, 19});
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
  Tensor g16 = Tensor::empty({n * 8}, DType::bf16), lse = Tensor::empty({n}, DType::f32);
  Tensor dh = Tensor::empty({n, hd}, DType::f32), dE = Tensor::zeros({v, hd}, DType::f32);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string f32_h =
      message([&] { cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h, E16, tg, ws, g16, opt); });
  EXPECT_NE(f32_h.find("cross_entropy_tied_forward_backward_bf16"), std::string::npos) << f32_h;
  EXPECT_NE(f32_h.find("h"), std::string::npos) << f32_h;
  EXPECT_NE(f32_h.find("bf16"), std::string::npos) << f32_h;
  Tensor small = Tensor::empty({n * 8 - 1}, DType::bf16);
  const std::string short_g =
      message([&] { cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, tg, ws, small, opt); });
  EXPECT_NE(short_g.find("g16 has 31 elements, needs"), std::string::npos) << short_g;
  const std::string f32_g = message([&] {
    cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, tg, ws,
                                             Tensor::empty({n * 8}, DType::f32), opt);
  });
  EXPECT_NE(f32_g.find("g16"), std::string::npos) << f32_g;
  Tensor bad_tg = make_targets({1, 2, 20, 3});
  const std::string bad =
      message([&] { cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, bad_tg, ws, g16, opt); });
  EXPECT_NE(bad.find("target 20 at row 2 is outside [0, 20)"), std::string::npos) << bad;
}

}  // namespace
}  // namespace zaya::ops
