// The tied head with bf16 GEMM inputs (cross_entropy_tied_forward_backward_bf16) against the closed
// form in float64 on the same bf16-rounded h and E, for chunkings that do and do not divide V and
// one chunk covering V; with one chunk, bitwise the materialized-logits ops on bf16-made logits
// (what the model's bf16 head was before the op existed); bad arguments named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/loss_reference.h"
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
