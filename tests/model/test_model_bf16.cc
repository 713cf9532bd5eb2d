// The bf16 GEMM option of ZayaModel (set_gemm_dtype): loss and gradients close to the fp32 step,
// actually different from it (the bf16 path ran), deterministic, and switching back to f32
// reproduces the fp32 step bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/random_model.h"
#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/model/model_internal.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/dense.h"

namespace zaya::model {
namespace {

ModelConfig small() {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.num_experts = 4;
  c.moe_intermediate_size = 24;
  c.router_hidden_size = 16;
  return c;
}

struct Step {
  double loss;
  std::vector<float> grads;
};

Step run(ZayaModel& m, const std::vector<int32_t>& ids, const std::vector<int32_t>& tg) {
  m.zero_grad();
  Step s;
  s.loss = m.forward(Tensor::borrow(const_cast<int32_t*>(ids.data()), Shape{m.batch(), m.seq_len()}, DType::i32),
                     Tensor::borrow(const_cast<int32_t*>(tg.data()), Shape{m.batch(), m.seq_len()}, DType::i32));
  m.backward();
  const float* g = m.grads_flat().data<float>();
  s.grads.assign(g, g + m.grads_flat().numel());
  return s;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(ModelBf16, CloseToFp32AndSwitchable) {
  const int64_t B = 2, T = 24;
  ZayaModel m(small(), B, T);
  m.init(3);
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = static_cast<int32_t>(1 + (i * 29) % 63);
  for (int64_t i = 0; i < B * T; ++i) tg[i] = (i % T == T - 1) ? -100 : ids[i + 1];
  const Step f32 = run(m, ids, tg);
  m.set_gemm_dtype(DType::bf16);
  EXPECT_EQ(m.gemm_dtype(), DType::bf16);
  const Step b1 = run(m, ids, tg), b2 = run(m, ids, tg);
  EXPECT_EQ(b1.loss, b2.loss);
  EXPECT_EQ(b1.grads, b2.grads);
  // bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 2e-3 per input); GEMM outputs accumulate in
  // f32. Measured here: loss 5e-6 relative, gradient vector 4e-3. Bounds 1e-2 and 5e-2 leave room for
  // other shapes and seeds; a wrong transpose or operand is O(1).
  EXPECT_NE(b1.loss, f32.loss);  // the bf16 GEMMs really ran
  EXPECT_LE(std::abs(b1.loss - f32.loss) / f32.loss, 1e-2);
  EXPECT_LE(rel(b1.grads, f32.grads), 5e-2);
  if (std::getenv("ZAYA_TEST_VERBOSE") != nullptr)
    std::printf("loss %.3e relative, gradient vector %.3e\n", std::abs(b1.loss - f32.loss) / f32.loss,
                rel(b1.grads, f32.grads));
  m.set_gemm_dtype(DType::f32);
  const Step back = run(m, ids, tg);
  EXPECT_EQ(back.loss, f32.loss);
  EXPECT_EQ(back.grads, f32.grads);
  EXPECT_THROW(m.set_gemm_dtype(DType::i32), Error);
}

// Every parameter's gradient and the loss of the bf16 step against the fp32 step, on random
// models: one loss chunk (V = 64), a chunked loss (V = 9000 > CrossEntropyOptions' 8192: chunks of
// 8192 and 808), and three layers.
//
// Tolerance, norm-wise per tensor: a GEMM with bf16 inputs and f32 accumulation is off by ~2^-8
// relative (each product carries two input roundings of ≤ 2^-9; a sum of random-sign terms keeps
// that relative size whatever K). The roundings of different GEMMs are independent, so along a
// gradient's path through G such GEMMs (the forward's 8 per layer plus the head's one, the
// backward's 2 for the head and 8 per layer: G = 16·L + 3) they add up like a random walk:
// √G·2^-8. Four times that bounds the spread (per tensor: 0.09 at L = 2, 0.11 at L = 3); a missing
// bf16 copy refresh, a wrong operand or transpose is O(1). The loss, a mean over tokens of a
// logsumexp, averages those errors: √G·2^-8 / 4 bounds it. Both compares assume the two steps route
// every token alike (a token that flips its expert moves its expert's gradient by O(1)): asserted.
struct Bf16Case {
  const char* name;
  test::ModelDims dims;
  int64_t B, T;
  uint64_t seed;
};

TEST(ModelBf16, LossAndEveryGradientWithinBf16OfFp32) {
  const Bf16Case cases[] = {
      {"one loss chunk", {4, 2, 16, 4, 2, 16, 24, 32, 64}, 2, 24, 11},
      {"chunked loss, V = 9000", {4, 2, 16, 4, 2, 16, 24, 32, 9000}, 2, 16, 12},
      {"three layers", {6, 2, 8, 5, 3, 24, 40, 48, 300}, 2, 20, 13},
  };
  const bool verbose = std::getenv("ZAYA_TEST_VERBOSE") != nullptr;
  for (const Bf16Case& k : cases) {
    SCOPED_TRACE(k.name);
    const ModelConfig c = test::small_config(k.dims, 64);
    ZayaModel m(c, k.B, k.T);
    std::vector<int32_t> ids(k.B * k.T), tg(k.B * k.T);
    for (int64_t i = 0; i < k.B * k.T; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    for (int64_t i = 0; i < k.B * k.T; ++i)
      tg[i] = (i % 11 == 5) ? -100 : static_cast<int32_t>((i * 104729 + 3) % c.vocab_size);
    auto choices = [&] {
      std::vector<int32_t> all;
      for (int l = 0; l < c.num_hidden_layers; ++l) {
        const Tensor ch = m.router_choice(l);
        all.insert(all.end(), ch.data<int32_t>(), ch.data<int32_t>() + ch.numel());
      }
      return all;
    };
    // The first weights of a fixed list of seeds whose tokens all route alike in both modes (a token
    // whose top router logits lie within the bf16 error of each other may flip).
    Step f32, b16;
    bool alike = false;
    for (uint64_t seed = k.seed; seed < k.seed + 20 && !alike; ++seed) {
      m.set_gemm_dtype(DType::f32);
      test::randomize(m, seed, 2.0f);
      f32 = run(m, ids, tg);
      const std::vector<int32_t> choice_f32 = choices();
      m.set_gemm_dtype(DType::bf16);
      b16 = run(m, ids, tg);
      alike = choices() == choice_f32;
      if (verbose) std::printf("seed %d: routing %s\n", static_cast<int>(seed), alike ? "alike" : "differs");
    }
    ASSERT_TRUE(alike) << "no seed of the list routes alike in f32 and bf16";
    const double gemms = 16.0 * c.num_hidden_layers + 3.0, per_gemm = 1.0 / 256;
    const double tol = 4.0 * std::sqrt(gemms) * per_gemm;
    EXPECT_NE(b16.loss, f32.loss);  // the bf16 GEMMs ran
    if (verbose) std::printf("loss %.3e relative\n", std::abs(b16.loss - f32.loss) / f32.loss);
    EXPECT_LE(std::abs(b16.loss - f32.loss) / f32.loss, std::sqrt(gemms) * per_gemm / 4)
        << b16.loss << " vs " << f32.loss;
    for (size_t i = 0; i < m.specs().size(); ++i) {
      const int64_t off = m.param_offset(static_cast<int>(i)), n = m.specs()[i].shape.numel();
      const std::vector<float> a(b16.grads.begin() + off, b16.grads.begin() + off + n),
          b(f32.grads.begin() + off, f32.grads.begin() + off + n);
      const double e = rel(a, b);
      if (verbose) std::printf("%-70s %.3e\n", m.specs()[i].name.c_str(), e);
      EXPECT_LE(e, tol) << m.specs()[i].name;
    }
  }
}

// The dense projections' GEMMs take bf16 inputs in the bf16 mode: layer 0's saved projection outputs
// are, bit for bit, linear_forward on bf16 copies of the saved f32 inputs and of the weights.
TEST(ModelBf16, DenseProjectionsRunOnBf16Copies) {
  const ModelConfig c = test::small_config({4, 2, 16, 4, 2, 16, 24, 32, 64}, 64);
  const int64_t B = 2, T = 12, N = B * T;
  ZayaModel m(c, B, T);
  test::randomize(m, 5, 2.0f);
  m.set_gemm_dtype(DType::bf16);
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = static_cast<int32_t>((i * 37 + 1) % c.vocab_size);
  m.forward(Tensor::borrow(ids.data(), Shape{B, T}, DType::i32), Tensor{}, false);
  const LayerActs& t = m.layer_acts(0);
  const LayerParams& p = m.layer_param_views(0);
  auto b16 = [](const Tensor& f) {
    Tensor b = Tensor::empty(f.shape(), DType::bf16);
    ops::cast_to_bf16(b, f);
    return b;
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  auto linear = [&](const Tensor& x16, const Tensor& W, const Tensor& bias) {
    Tensor y = Tensor::empty(Shape{x16.size(0), W.size(0)}, DType::f32);
    ops::linear_forward(y, x16, b16(W), bias);
    return y;
  };
  const int64_t C = c.conv_channels();
  // u's f32 field is staging in this mode (shared by the layers), so layer 0's u16 is checked
  // against its RMSNorm_in(x⁰) made again.
  Tensor u = Tensor::empty(t.x_mid.shape(), DType::f32), rstd_in = Tensor::empty(Shape{N}, DType::f32);
  ops::rmsnorm_forward(u, rstd_in, m.layer_input(0), p.w_in, static_cast<float>(c.rms_norm_eps));
  EXPECT_TRUE(same(t.u16, b16(u)));
  EXPECT_TRUE(same(t.z, linear(t.u16, p.w_qkv.slice(0, C), Tensor{})));
  EXPECT_TRUE(same(t.att16, b16(t.att)));
  EXPECT_TRUE(same(t.o, linear(t.att16, p.w_o, Tensor{})));
  // w's f32 field is staging in this mode (shared by the layers: the last layer's forward wrote
  // it), so layer 0's w16 is checked against its RMSNorm_post(x_mid) made again.
  Tensor w = Tensor::empty(t.x_mid.shape(), DType::f32), rstd = Tensor::empty(Shape{N}, DType::f32);
  ops::rmsnorm_forward(w, rstd, t.x_mid, p.w_post, static_cast<float>(c.rms_norm_eps));
  EXPECT_TRUE(same(t.w16, b16(w)));
  EXPECT_TRUE(same(t.r, linear(t.w16, p.w_down, p.b_down)));  // layer 0 has no EDA term
  EXPECT_TRUE(same(t.a1, linear(t.zr16, p.fc1w, p.fc1b)));
  EXPECT_TRUE(same(t.a2, linear(t.g1_16, p.fc2w, p.fc2b)));
  // Their f32 counterparts would give other bits.
  Tensor y32 = Tensor::empty(t.o.shape(), DType::f32);
  ops::linear_forward(y32, t.att, p.w_o, Tensor{});
  EXPECT_FALSE(same(t.o, y32));
}

// In the bf16 mode the f32 values that only feed their bf16 copies (u, w without the skip
// passthrough, the experts' xp and act, the router's zr, g1, g2) are one buffer shared by every
// layer. The backward must read none of them: filled with NaN between the forward and the
// backward, the loss and every gradient stay bitwise those of the untouched step (tolerance 0; a
// read would carry NaN into some gradient). Both with the skip passthrough, whose backward reads
// w (kept per layer then), and without.
TEST(ModelBf16, StagedF32ActivationsAreSharedAndReadByNoBackward) {
  for (bool passthrough : {false, true}) {
    SCOPED_TRACE(passthrough ? "skip passthrough" : "no skip passthrough");
    ModelConfig c = test::small_config({4, 2, 16, 4, 3, 16, 24, 32, 64}, 64);
    c.skip_passthrough = passthrough;
    const int64_t B = 2, T = 12, N = B * T;
    ZayaModel m(c, B, T);
    test::randomize(m, 17, 2.0f);
    std::vector<int32_t> ids(N), tg(N);
    for (int64_t i = 0; i < N; ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + 1) % c.vocab_size);
      tg[i] = static_cast<int32_t>((i * 11 + 3) % c.vocab_size);
    }
    const Tensor tid = Tensor::borrow(ids.data(), Shape{B, T}, DType::i32),
                 ttg = Tensor::borrow(tg.data(), Shape{B, T}, DType::i32);
    auto step = [&](bool poison) {
      m.zero_grad();
      Step s;
      s.loss = m.forward(tid, ttg);
      if (poison)
        for (int l = 0; l < c.num_hidden_layers; ++l) {
          const LayerActs& t = m.layer_acts(l);
          for (Tensor x : {t.u, t.xp, t.act, t.zr, t.g1, t.g2}) x.fill_(std::nan(""));
          if (!passthrough) Tensor(t.w).fill_(std::nan(""));
        }
      m.backward();
      const float* g = m.grads_flat().data<float>();
      s.grads.assign(g, g + m.grads_flat().numel());
      return s;
    };
    // f32 mode: every layer has its own.
    for (int l = 1; l < c.num_hidden_layers; ++l)
      for (auto f : {&LayerActs::u, &LayerActs::w, &LayerActs::xp, &LayerActs::act})
        EXPECT_NE((m.layer_acts(l).*f).raw(), (m.layer_acts(0).*f).raw()) << "layer " << l;
    m.set_gemm_dtype(DType::bf16);
    for (int l = 1; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ(m.layer_acts(l).u.raw(), m.layer_acts(0).u.raw()) << "layer " << l;
      EXPECT_EQ(m.layer_acts(l).xp.raw(), m.layer_acts(0).xp.raw()) << "layer " << l;
      EXPECT_EQ(m.layer_acts(l).act.raw(), m.layer_acts(0).act.raw()) << "layer " << l;
      EXPECT_EQ(m.layer_acts(l).w.raw() == m.layer_acts(0).w.raw(), !passthrough) << "layer " << l;
      EXPECT_NE(m.layer_acts(l).xp16.raw(), m.layer_acts(0).xp16.raw()) << "layer " << l;
    }
    const Step clean = step(false), poisoned = step(true);
    EXPECT_EQ(std::memcmp(&clean.loss, &poisoned.loss, sizeof(double)), 0);
    ASSERT_EQ(clean.grads.size(), poisoned.grads.size());
    for (size_t i = 0; i < m.specs().size(); ++i) {
      const int64_t off = m.param_offset(static_cast<int>(i)), n = m.specs()[i].shape.numel();
      EXPECT_EQ(std::memcmp(clean.grads.data() + off, poisoned.grads.data() + off, static_cast<size_t>(n) * 4), 0)
          << m.specs()[i].name;
    }
  }
}

// The bf16 mode's saved bytes per layer are the f32 mode's plus the bf16 copies of the GEMM inputs
// (u, att, w, zr, g1, g2, xp, act) less the f32 values kept only as staging for them (u, zr, g1,
// g2, xp, act, and w without the skip passthrough), exactly, with recompute off and on (the one
// shared set shrinks alike). The staging buffers are the model's, once: with recompute off, a
// per-layer w (the passthrough's) costs L − 1 more [N, H] f32 blocks than the shared one; with it
// on, none (layer 0's set is the shared one). N = 64 rows, so every block is a multiple of the
// arena's 64-byte alignment and no padding blurs the sums.
TEST(ModelBf16, SavedBytesPerLayerKeepOnlyTheBf16CopiesOfStagedInputs) {
  const ModelConfig base = test::small_config({4, 2, 16, 4, 3, 16, 24, 32, 64}, 64);
  const int64_t B = 2, T = 32, N = B * T, H = base.hidden_size, q = base.q_dim(), R = base.router_hidden_size,
                I = base.moe_intermediate_size, L = base.num_hidden_layers;
  for (bool recompute : {false, true}) {
    size_t arena[2] = {};
    for (bool passthrough : {false, true}) {
      SCOPED_TRACE(testing::Message() << "recompute " << recompute << ", skip passthrough " << passthrough);
      ModelConfig c = base;
      c.skip_passthrough = passthrough;
      ZayaModel m(c, B, T);
      m.set_recompute(recompute);
      const double f32 = m.saved_bytes_per_token_per_layer() * static_cast<double>(N);
      m.set_gemm_dtype(DType::bf16);
      const double copies = 2.0 * static_cast<double>(N * (H + q + H + 3 * R + H + I));
      const double staged = 4.0 * static_cast<double>(N * (H + 3 * R + H + I + (passthrough ? 0 : H)));
      EXPECT_EQ(m.saved_bytes_per_token_per_layer() * static_cast<double>(N), f32 + copies - staged);
      arena[passthrough] = m.activation_bytes();
    }
    const size_t per_layer_w = recompute ? 0 : static_cast<size_t>((L - 1) * 4 * N * H);
    EXPECT_EQ(arena[1] - arena[0], per_layer_w) << "recompute " << recompute;
  }
}

}  // namespace
}  // namespace zaya::model
