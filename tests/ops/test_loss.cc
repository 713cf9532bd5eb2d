// Fused tied-head cross-entropy against a naive full-logits float64 reference: chunk sizes that
// do and do not divide V, ignored targets, the all-ignored edge case, determinism, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gradcheck.h"
#include "ops/loss_reference.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/loss_cpu.h"
#include "zaya/ops/loss.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;
using loss_test::ce_reference;
using loss_test::make_targets;

Vec plus(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

TEST(CrossEntropy, MatchesNaiveReferenceForEveryChunking) {
  const int64_t n = 7, hd = 13, v = 50;
  // Rows 2 and 5 are ignored; target 49 lands in the last (partial) chunk, 0 in the first.
  std::vector<int32_t> t = {3, 49, -100, 17, 0, -100, 33};
  Tensor h = random_tensor({n, hd}, 1), E = random_tensor({v, hd}, 2), tg = make_targets(t);
  Vec hv = to_f64(h), ev = to_f64(E), lse_ref;
  double loss_ref = ce_reference(hv, ev, t, n, hd, v, &lse_ref);
  Vec dh_ref = test::numerical_gradient([&](const Vec& x) { return ce_reference(x, ev, t, n, hd, v); }, hv);
  Vec de_ref = test::numerical_gradient([&](const Vec& x) { return ce_reference(hv, x, t, n, hd, v); }, ev);
  for (int64_t chunk : {16, 25, 50, 7, 4096}) {  // 16 and 7 leave a partial last chunk
    CrossEntropyOptions opt{.chunk = chunk};
    Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
    Tensor lse = Tensor::empty({n}, DType::f32);
    CrossEntropyResult fwd = cross_entropy_tied_forward(lse, h, E, tg, ws, opt);
    // Logits sum 13 f32 products; exp/log are ~1 ulp: relative error ~1e-6 on a loss of ~O(4).
    EXPECT_NEAR(fwd.loss, loss_ref, 1e-5 * std::fabs(loss_ref)) << "chunk " << chunk;
    EXPECT_EQ(fwd.count, 5);
    EXPECT_LT(test::rel_error(lse, lse_ref), 1e-6) << "chunk " << chunk;  // same reason, per row

    Tensor dh = random_tensor({n, hd}, 3);  // garbage: dh must be written, not accumulated
    Tensor dE = random_tensor({v, hd}, 4);
    Vec de0 = to_f64(dE);
    CrossEntropyResult both = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
    EXPECT_EQ(both.loss, fwd.loss);  // the same forward code, bitwise
    // Gradients: f32 softmax probabilities (~1e-7 relative) summed over up to 50 vocabulary rows
    // (dh) or 7 tokens (dE), vs central differences good to ~1e-9: 2e-5 leaves a wide margin.
    EXPECT_LT(test::rel_error(dh, dh_ref), 2e-5) << "chunk " << chunk;
    EXPECT_LT(test::rel_error(dE, plus(de0, de_ref)), 2e-5) << "chunk " << chunk;
  }
}

TEST(CrossEntropy, LargerShapeAgainstAnalyticGradient) {
  // Too big for finite differences at test speed: compare with the closed form in double,
  // dlogit = (softmax − onehot)/count, dh = G·E, dE = Gᵀ·h.
  const int64_t n = 33, hd = 64, v = 1000;
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 5 == 4 ? -100 : static_cast<int32_t>((i * 397) % v);
  Tensor h = random_tensor({n, hd}, 5, 0.5f), E = random_tensor({v, hd}, 6, 0.5f), tg = make_targets(t);
  Vec hv = to_f64(h), ev = to_f64(E), lse_ref;
  double loss_ref = ce_reference(hv, ev, t, n, hd, v, &lse_ref);
  int64_t count = 0;
  for (int32_t x : t) count += x != -100;
  Vec dh_ref(n * hd, 0.0), de_ref(v * hd, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == -100) continue;
    for (int64_t j = 0; j < v; ++j) {
      double l = 0;
      for (int64_t k = 0; k < hd; ++k) l += hv[i * hd + k] * ev[j * hd + k];
      double g = (std::exp(l - lse_ref[i]) - (j == t[i] ? 1.0 : 0.0)) / count;
      for (int64_t k = 0; k < hd; ++k) {
        dh_ref[i * hd + k] += g * ev[j * hd + k];
        de_ref[j * hd + k] += g * hv[i * hd + k];
      }
    }
  }
  CrossEntropyOptions opt{.chunk = 256};  // 1000 = 3·256 + 232
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
  Tensor lse = Tensor::empty({n}, DType::f32), dh = Tensor::empty({n, hd}, DType::f32);
  Tensor dE = Tensor::zeros({v, hd}, DType::f32);
  CrossEntropyResult r = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
  // As above, with 64-term logits and 1000-term sums: still well inside 1e-5 / 5e-5.
  EXPECT_NEAR(r.loss, loss_ref, 1e-5 * std::fabs(loss_ref));
  EXPECT_LT(test::rel_error(dh, dh_ref), 5e-5);
  EXPECT_LT(test::rel_error(dE, de_ref), 5e-5);
}

// Logits spread over hundreds of nats: most probabilities are below 2^-100 (and below float's normal
// range), which the op stores as 0 before the head GEMMs (cpu/loss_cpu.cc, flush_tiny). The gradients must
// still equal the closed form in double (which keeps every tiny term), for the kept-exps path
// (chunk = V) and the recomputing one; the loss too.
TEST(CrossEntropy, SpreadLogitsWithTinyProbabilitiesMatchReference) {
  const int64_t n = 16, hd = 64, v = 300;
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37) % v);
  Tensor h = random_tensor({n, hd}, 7, 3.0f), E = random_tensor({v, hd}, 8, 3.0f), tg = make_targets(t);
  Vec hv = to_f64(h), ev = to_f64(E), lse_ref;
  double loss_ref = ce_reference(hv, ev, t, n, hd, v, &lse_ref);
  Vec dh_ref(n * hd, 0.0), de_ref(v * hd, 0.0);
  int64_t tiny = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j) {
      double l = 0;
      for (int64_t k = 0; k < hd; ++k) l += hv[i * hd + k] * ev[j * hd + k];
      const double p = std::exp(l - lse_ref[i]);
      tiny += p < 0x1p-100;
      const double g = (p - (j == t[i] ? 1.0 : 0.0)) / n;
      for (int64_t k = 0; k < hd; ++k) {
        dh_ref[i * hd + k] += g * ev[j * hd + k];
        de_ref[j * hd + k] += g * hv[i * hd + k];
      }
    }
  ASSERT_GT(tiny, n * v / 2) << "the test needs most probabilities below 2^-100";
  for (int64_t chunk : {v, int64_t{128}}) {
    CrossEntropyOptions opt{.chunk = chunk};
    Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
    Tensor lse = Tensor::empty({n}, DType::f32), dh = Tensor::empty({n, hd}, DType::f32);
    Tensor dE = Tensor::zeros({v, hd}, DType::f32);
    CrossEntropyResult r = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
    // Logits of magnitude ~100 carry ~1e-5 absolute rounding (64 f32 products), so the loss and
    // the probabilities that matter are good to ~1e-5 relative; 1e-4 bounds.
    EXPECT_NEAR(r.loss, loss_ref, 1e-4 * std::fabs(loss_ref)) << "chunk " << chunk;
    EXPECT_LT(test::rel_error(dh, dh_ref), 1e-4) << "chunk " << chunk;
    EXPECT_LT(test::rel_error(dE, de_ref), 1e-4) << "chunk " << chunk;
  }
}

TEST(CrossEntropy, AllTargetsIgnoredGivesZeroLossAndGrads) {
  const int64_t n = 4, hd = 5, v = 9;
  Tensor h = random_tensor({n, hd}, 1), E = random_tensor({v, hd}, 2), tg = make_targets({-100, -100, -100, -100});
  CrossEntropyOptions opt{.chunk = 4};
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
  Tensor lse = Tensor::empty({n}, DType::f32), dh = random_tensor({n, hd}, 3), dE = random_tensor({v, hd}, 4);
  Tensor dE0 = dE.clone();
  CrossEntropyResult r = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_EQ(r.count, 0);
  for (int64_t i = 0; i < dh.numel(); ++i) EXPECT_EQ(dh.data<float>()[i], 0.0f);
  EXPECT_EQ(0, std::memcmp(dE.raw(), dE0.raw(), dE.nbytes()));
}

TEST(CrossEntropy, KeptExpsBackwardMatchesRecomputingBackward) {
  // One chunk covering V takes the backward from the forward's kept exponentials (the one-hot part
  // as a separate [N, H] correction); several chunks recompute G = softmax − onehot per chunk. Both
  // must agree, also with ignored rows and several tokens sharing a target (the dE correction).
  const int64_t n = 40, hd = 24, v = 300;
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 7 == 3 ? -100 : static_cast<int32_t>((i % 9) * 31);
  Tensor h = random_tensor({n, hd}, 7), E = random_tensor({v, hd}, 8), tg = make_targets(t);
  std::vector<Tensor> out;
  std::vector<double> loss;
  for (int64_t chunk : {64, 300}) {
    CrossEntropyOptions opt{.chunk = chunk};
    Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
    Tensor lse = Tensor::empty({n}, DType::f32), dh = random_tensor({n, hd}, 9), dE = random_tensor({v, hd}, 10);
    loss.push_back(cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt).loss);
    out.push_back(dh);
    out.push_back(dE);
  }
  // Same math, different f32 rounding (24-term logits, 300-term sums): ~1e-6 relative.
  EXPECT_NEAR(loss[0], loss[1], 1e-6 * std::fabs(loss[0]));
  EXPECT_LT(test::rel_error(out[2], to_f64(out[0])), 1e-5);
  EXPECT_LT(test::rel_error(out[3], to_f64(out[1])), 1e-5);
}

TEST(CrossEntropy, LossFromCallerLogitsMatchesTheFusedForward) {
  const int64_t n = 30, hd = 16, v = 200;
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 6 == 5 ? -100 : static_cast<int32_t>((i * 53) % v);
  Tensor h = random_tensor({n, hd}, 11), E = random_tensor({v, hd}, 12), tg = make_targets(t);
  Vec lse_ref;
  const double loss_ref = ce_reference(to_f64(h), to_f64(E), t, n, hd, v, &lse_ref);
  Tensor logits = Tensor::empty({n, v}, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < hd; ++k) acc += double(h.data<float>()[i * hd + k]) * E.data<float>()[j * hd + k];
      logits.data<float>()[i * v + j] = static_cast<float>(acc);
    }
  Tensor before = logits.clone(), lse = Tensor::empty({n}, DType::f32);
  CrossEntropyResult r = cross_entropy_logits_forward(lse, logits, tg);
  EXPECT_EQ(r.count, 25);
  EXPECT_NEAR(r.loss, loss_ref, 1e-6 * std::fabs(loss_ref));  // f32 exp/log sums of 200 terms
  EXPECT_LT(test::rel_error(lse, lse_ref), 1e-6);
  EXPECT_EQ(0, std::memcmp(logits.raw(), before.raw(), logits.nbytes()));  // left as they were
  tg.data<int32_t>()[3] = static_cast<int32_t>(v);
  EXPECT_THROW(cross_entropy_logits_forward(lse, logits, tg), Error);
}

TEST(CrossEntropy, BadArgumentsAreNamed) {
  const int64_t n = 3, hd = 4, v = 10;
  Tensor h = random_tensor({n, hd}, 1), E = random_tensor({v, hd}, 2);
  Tensor lse = Tensor::empty({n}, DType::f32);
  Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v)}, DType::f32);
  try {
    cross_entropy_tied_forward(lse, h, E, make_targets({1, 10, 2}), ws);
    ADD_FAILURE() << "target 10 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 10"), std::string::npos) << e.what();
  }
  Tensor E_bad = random_tensor({v, hd + 1}, 2);
  try {
    cross_entropy_tied_forward(lse, h, E_bad, make_targets({1, 2, 3}), ws);
    ADD_FAILURE() << "mismatched E accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[10, 5]"), std::string::npos) << msg;
  }
  Tensor small = Tensor::empty({5}, DType::f32);
  EXPECT_THROW(cross_entropy_tied_forward(lse, h, E, make_targets({1, 2, 3}), small), Error);
}

TEST(CrossEntropy, LogitsBackwardIsSoftmaxMinusOnehotOverCount) {
  const int64_t N = 5, V = 37;
  Tensor logits = random_tensor({N, V}, 71, 2.0f);
  Vec ref = to_f64(logits);
  Tensor targets = Tensor::empty({N}, DType::i32);
  const int32_t t[N] = {3, -100, 36, 0, 11};
  std::memcpy(targets.data<int32_t>(), t, sizeof t);
  Tensor lse = Tensor::empty({N}, DType::f32);
  for (int64_t i = 0; i < N; ++i) {
    double m = -1e300, z = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, ref[i * V + j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(ref[i * V + j] - m);
    lse.data<float>()[i] = static_cast<float>(m + std::log(z));
  }
  const int64_t count = 4;  // one ignored row
  Vec want(static_cast<size_t>(N * V), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    if (t[i] == -100) continue;
    for (int64_t j = 0; j < V; ++j)
      want[i * V + j] = (std::exp(ref[i * V + j] - lse.data<float>()[i]) - (j == t[i] ? 1.0 : 0.0)) / count;
  }
  cross_entropy_logits_backward(logits, lse, targets, count);
  // expf_fast is within a few ulp of exp; the result is f32: 1e-5 relative covers both.
  EXPECT_LT(test::rel_error(logits, want), 1e-5);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(logits.data<float>()[1 * V + j], 0.0f);  // ignored row
}

// The cross-entropy fronts handed CUDA tensors (host memory labelled CUDA: device_dispatch.h) check
// them as on the CPU and, without a GPU, stop at the device context naming the op (before the
// targets would be read); mixed devices name the argument. With a GPU, test_loss_cuda.cc runs them.
TEST(CrossEntropyDevice, CudaKernelsWithoutAGpuGiveAClearErrorAndMixedDevicesNameTheArgument) {
  test::CudaLabelled cu;
  const int64_t n = 4, h = 8, vocab = 16;
  const CrossEntropyOptions opt;
  Tensor H = cu({n, h}), E = cu({vocab, h}), targets = cu({n}, DType::i32), lse = cu({n});
  Tensor ws = cu({cross_entropy_workspace_elems(n, vocab, opt)}), dH = cu({n, h}), dE = cu({vocab, h});
  Tensor logits = cu({n, vocab});
  Tensor targets_cpu = Tensor::zeros({n}, DType::i32);
  test::expect_mixed_devices("cross_entropy_tied_forward", "targets",
                             [&] { cross_entropy_tied_forward(lse, H, E, targets_cpu, ws, opt); });
  Tensor H16 = cu({n, h}, DType::bf16), E16 = cu({vocab, h}, DType::bf16), g16 = cu({n * vocab}, DType::bf16);
  test::expect_mixed_devices("cross_entropy_tied_forward_bf16", "targets",
                             [&] { cross_entropy_tied_forward_bf16(lse, H16, E16, targets_cpu, ws, opt); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_loss_cuda.cc runs these ops on it";
  using test::expect_needs_gpu;
  expect_needs_gpu("cross_entropy_tied_forward", [&] { cross_entropy_tied_forward(lse, H, E, targets, ws, opt); });
  expect_needs_gpu("cross_entropy_tied_forward_backward",
                   [&] { cross_entropy_tied_forward_backward(dH, dE, lse, H, E, targets, ws, opt); });
  expect_needs_gpu("cross_entropy_tied_forward_bf16",
                   [&] { cross_entropy_tied_forward_bf16(lse, H16, E16, targets, ws, opt); });
  expect_needs_gpu("cross_entropy_tied_forward_backward_bf16", [&] {
    cross_entropy_tied_forward_backward_bf16(dH, dE, lse, H16, E16, targets, ws, g16, opt);
  });
  expect_needs_gpu("cross_entropy_logits_forward", [&] { cross_entropy_logits_forward(lse, logits, targets); });
  expect_needs_gpu("cross_entropy_logits_backward", [&] { cross_entropy_logits_backward(logits, lse, targets, n); });
}

}  // namespace
}  // namespace zaya::ops
