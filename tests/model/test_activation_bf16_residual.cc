// bf16 saved activations (ZayaModel::set_activation_dtype) for the residual scalings' h (the
// attention's o_proj output o and the MoE output m), and the bf16 GEMM mode's staging of the input
// norm's output u: the forward computes from the f32 values (shared scratch), each layer keeps bf16
// copies, the backward reads those. The reference is the same model with f32 activations and bf16
// GEMMs.
//
// What must hold, and why it is exact or bounded:
// - The forward is the same computation on the same values, so the loss is bitwise the reference's.
// - Of the residual scaling's backward only ds_h += Σ_n dy ⊙ (h + b_h) reads h (dh = dy ⊙ s_h and
//   dx = dy ⊙ s_x do not), so every activation gradient, and every parameter gradient but the
//   residual scalings' hidden_states_scale, is the same computation on the same values: bitwise.
// - ds_h: each h is rounded to bf16, 8 significant bits: the error is at most half an ulp, 2^-8
//   relative (1 + 2^-8 rounds to 1), spread evenly over ±half an ulp, so its relative rms is at
//   most 2^-8/√3 = 2.3e-3, and independent from term to term. So Δds_h[j] = Σ_n dy[n,j]·(h̃ − h)[n,j]
//   adds like a random walk, of size ≤ (2^-8/√3)·√(Σ_n dy²h²), against ds_h[j] = Σ_n dy[n,j]·(h[n,j]
//   + b_h[j]), a sum of the same terms (plus the bias's) whose norm over the columns is about
//   √(Σ_n dy²(h + b)²): norm-wise per tensor about 2^-8/√3 relative at most (measured 0.9e-3 to
//   2.9e-3 over these models). Four times that, 9.0e-3, bounds it (the cancellations of 32 to 48
//   columns' sums of 32 to 48 rows); reading h unrounded gives 0 (asserted to differ), reading a
//   wrong h (another layer's, the other scaling's) O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_or_emulated.h"
#include "model/random_model.h"
#include "zaya/core/error.h"
#include "zaya/model/generate.h"
#include "zaya/model/model_internal.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/dense.h"

namespace zaya::model {
namespace {

constexpr double kHiddenScaleTol = 4.0 * 0.00390625 / 1.7320508075688772;  // 4 · 2^-8 / √3

struct Step {
  double loss;
  std::vector<float> grads;
};

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  return {h.data<float>(), h.data<float>() + h.numel()};
}

Step train_step(ZayaModel& m, const Tensor& ids, const Tensor& tg) {
  m.zero_grad();
  Step s;
  s.loss = m.forward(ids, tg);
  m.backward();
  s.grads = host_floats(m.grads_flat());
  return s;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed, Device device = Device::cpu) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + seed * 13) % V);
  return t.to(device);
}

// The residual scalings' hidden_states_scale: the only gradients that read h.
bool reads_h(const std::string& name) {
  return name.find("residual_scale.hidden_states_scale") != std::string::npos;
}

double rel(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// a (bf16 activations) against ref (f32 activations): the loss bitwise, the hidden_states_scale
// gradients within kHiddenScaleTol and not equal, every other gradient bitwise.
void expect_only_hidden_scales_move(const ZayaModel& m, const Step& a, const Step& ref) {
  const bool verbose = std::getenv("ZAYA_TEST_VERBOSE") != nullptr;
  EXPECT_EQ(std::memcmp(&a.loss, &ref.loss, sizeof(double)), 0) << a.loss << " vs " << ref.loss;
  ASSERT_EQ(a.grads.size(), ref.grads.size());
  int moved = 0;
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const std::string& name = m.specs()[i].name;
    const int64_t off = m.param_offset(static_cast<int>(i)), n = m.specs()[i].shape.numel();
    const float *x = a.grads.data() + off, *y = ref.grads.data() + off;
    if (reads_h(name)) {
      const double e = rel(x, y, n);
      if (verbose) std::printf("%-70s %.3e\n", name.c_str(), e);
      EXPECT_GT(e, 0.0) << name << ": the rounded h was not read";
      EXPECT_LE(e, kHiddenScaleTol) << name;
      ++moved;
    } else {
      EXPECT_EQ(std::memcmp(x, y, static_cast<size_t>(n) * sizeof(float)), 0) << name << " differs in some bit";
    }
  }
  EXPECT_EQ(moved, 2 * m.config().num_hidden_layers);
}

struct Case {
  const char* name;
  test::ModelDims dims;
  bool passthrough;
  int64_t B, T;
  uint64_t seed;
};

const Case kCases[] = {
    {"two layers", {4, 2, 16, 4, 2, 16, 24, 32, 64}, false, 2, 24, 11},
    {"three layers, chunked loss", {6, 2, 8, 5, 3, 24, 40, 48, 9000}, false, 2, 20, 13},
    {"skip passthrough", {4, 2, 16, 4, 3, 16, 24, 32, 96}, true, 2, 16, 17},
};

TEST(ActivationBf16Residual, LossBitwiseAndOnlyTheHiddenScaleGradientsMove) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(k.name);
    ModelConfig c = test::small_config(k.dims, 64);
    c.skip_passthrough = k.passthrough;
    ZayaModel m(c, k.B, k.T);
    test::randomize(m, k.seed, 2.0f);
    m.set_gemm_dtype(DType::bf16);
    const Tensor ids = tokens(k.B, k.T, c.vocab_size, 1), tg = tokens(k.B, k.T, c.vocab_size, 2);
    const Step ref = train_step(m, ids, tg);
    m.set_activation_dtype(DType::bf16);
    EXPECT_EQ(m.activation_dtype(), DType::bf16);
    const Step a = train_step(m, ids, tg);
    expect_only_hidden_scales_move(m, a, ref);
    // Recompute re-runs each layer's forward, bf16 copies included: bitwise the same step.
    m.set_recompute(true);
    const Step r = train_step(m, ids, tg);
    EXPECT_EQ(std::memcmp(&r.loss, &a.loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(r.grads.data(), a.grads.data(), a.grads.size() * sizeof(float)), 0) << "recompute";
    // And back: f32 activations give the reference again.
    m.set_recompute(false);
    m.set_activation_dtype(DType::f32);
    const Step back = train_step(m, ids, tg);
    EXPECT_EQ(std::memcmp(back.grads.data(), ref.grads.data(), ref.grads.size() * sizeof(float)), 0) << "back to f32";
  }
  ZayaModel m(test::small_config(kCases[0].dims, 64), 2, 8);
  EXPECT_THROW(m.set_activation_dtype(DType::bf16), Error);  // needs bf16 GEMMs
}

// The same on the device: a CPU model's random weights copied to a device model. On a GPU the CUDA
// kernels (the bf16-h residual scaling among them) must keep the same facts on their own: the loss
// bitwise its f32-activation loss, only the hidden_states_scale gradients moved, within the bound.
// On the emulated device the CPU kernels run, so the device's step is also bitwise the CPU's.
TEST(ActivationBf16Residual, LossBitwiseAndOnlyTheHiddenScaleGradientsMoveOnTheDevice) {
  ZAYA_GPU_OR_EMULATED(real);
  for (const Case& k : {kCases[0], kCases[2]}) {
    SCOPED_TRACE(k.name);
    ModelConfig c = test::small_config(k.dims, 64);
    c.skip_passthrough = k.passthrough;
    ZayaModel cpu(c, k.B, k.T), dev(c, k.B, k.T, Device::cuda);
    test::randomize(cpu, k.seed, 2.0f);
    Tensor(dev.params_flat()).copy_from(cpu.params_flat());
    Tensor(dev.balancing_biases()).copy_from(cpu.balancing_biases());
    for (ZayaModel* m : {&cpu, &dev}) m->set_gemm_dtype(DType::bf16);
    const Tensor ids = tokens(k.B, k.T, c.vocab_size, 3), tg = tokens(k.B, k.T, c.vocab_size, 4);
    const Step ref = train_step(dev, ids.to(Device::cuda), tg.to(Device::cuda));
    dev.set_activation_dtype(DType::bf16);
    const Step a = train_step(dev, ids.to(Device::cuda), tg.to(Device::cuda));
    expect_only_hidden_scales_move(dev, a, ref);
    if (!real) {
      cpu.set_activation_dtype(DType::bf16);
      const Step host = train_step(cpu, ids, tg);
      EXPECT_EQ(std::memcmp(&host.loss, &a.loss, sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(host.grads.data(), a.grads.data(), a.grads.size() * sizeof(float)), 0);
    }
  }
}

// With bf16 activations o and m are one f32 buffer shared by every layer (as u is in the bf16 GEMM
// mode), each layer keeping its own bf16 copies. The backward must read none of the f32 values:
// filled with NaN between the forward and the backward, the loss and every gradient stay bitwise
// those of the untouched step (tolerance 0; a read would carry NaN into some gradient).
TEST(ActivationBf16Residual, F32HIsSharedAndReadByNoBackward) {
  const ModelConfig c = test::small_config({4, 2, 16, 4, 3, 16, 24, 32, 64}, 64);
  const int64_t B = 2, T = 12;
  ZayaModel m(c, B, T);
  test::randomize(m, 19, 2.0f);
  m.set_gemm_dtype(DType::bf16);
  m.set_activation_dtype(DType::bf16);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerActs &t = m.layer_acts(l), &t0 = m.layer_acts(0);
    EXPECT_EQ(t.o.raw(), t0.o.raw()) << "layer " << l;
    EXPECT_EQ(t.m.raw(), t0.o.raw()) << "layer " << l;  // o is spent before m is made
    EXPECT_EQ(t.u.raw(), t0.u.raw()) << "layer " << l;
    EXPECT_EQ(t.o16.dtype(), DType::bf16);
    if (l > 0) {
      EXPECT_NE(t.o16.raw(), t0.o16.raw()) << "layer " << l;
      EXPECT_NE(t.m16.raw(), t0.m16.raw()) << "layer " << l;
    }
  }
  const Tensor ids = tokens(B, T, c.vocab_size, 5), tg = tokens(B, T, c.vocab_size, 6);
  auto step = [&](bool poison) {
    m.zero_grad();
    Step s;
    s.loss = m.forward(ids, tg);
    if (poison)
      for (int l = 0; l < c.num_hidden_layers; ++l) {
        const LayerActs& t = m.layer_acts(l);
        for (Tensor x : {t.o, t.m, t.u}) x.fill_(std::nan(""));
      }
    m.backward();
    s.grads = host_floats(m.grads_flat());
    return s;
  };
  const Step clean = step(false), poisoned = step(true);
  EXPECT_EQ(std::memcmp(&clean.loss, &poisoned.loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(clean.grads.data(), poisoned.grads.data(), clean.grads.size() * sizeof(float)), 0);
}

// Saved bytes per layer with bf16 activations: the bf16 GEMM mode's less the f32 o and m (4 bytes
// each per element) plus their bf16 copies (2 each): 4·N·H fewer, exactly, with recompute off and on.
// The arena gains the one shared f32 block [N, H] for o and m: L·4NH − 4NH smaller without
// recompute; with it the one saved set shrinks by what the block adds, so the arena is unchanged.
// N = 64 rows: every block a multiple of the arena's 64-byte alignment, no padding in the sums.
TEST(ActivationBf16Residual, SavedBytesPerLayerShrinkByTheF32OAndM) {
  const ModelConfig c = test::small_config({4, 2, 16, 4, 3, 16, 24, 32, 64}, 64);
  const int64_t B = 2, T = 32, N = B * T, H = c.hidden_size, L = c.num_hidden_layers;
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    ZayaModel m(c, B, T);
    m.set_recompute(recompute);
    m.set_gemm_dtype(DType::bf16);
    const double saved = m.saved_bytes_per_token_per_layer() * static_cast<double>(N);
    const size_t arena = m.activation_bytes();
    m.set_activation_dtype(DType::bf16);
    EXPECT_EQ(m.saved_bytes_per_token_per_layer() * static_cast<double>(N), saved - 4.0 * static_cast<double>(N * H));
    const int64_t layers_saved = recompute ? 1 : L;
    EXPECT_EQ(static_cast<int64_t>(arena) - static_cast<int64_t>(m.activation_bytes()), (layers_saved - 1) * 4 * N * H);
  }
}

// The cached decoder needs each layer's normed input u of the last prompt token (for that token's
// delayed value vd = u·W_vdᵀ). It normalizes the layer input x^l again, per row, so it reads no
// saved u, and gets the forward's u bits: with f32 GEMMs (which keep u per layer) every layer's vd
// is bitwise u·W_vdᵀ from the forward's saved u; with bf16 GEMMs (u is shared scratch, holding the
// last layer's after the forward) the last layer's is. bf16 activations change nothing a decode
// reads: the caches and the greedy tokens are bitwise those of f32 activations.
TEST(ActivationBf16Residual, DecodeReadsNoSavedUAndIsUnchanged) {
  const ModelConfig c = test::small_config({4, 2, 16, 4, 3, 16, 24, 32, 96}, 64, 1000.0);
  const int64_t B = 2, T0 = 7, C = c.conv_channels(), kv = c.kv_dim(), H = c.hidden_size;
  const Tensor prompt = tokens(B, T0, c.vocab_size, 9);
  auto vd_from_saved_u = [&](ZayaModel& m, int l) {
    Tensor u = Tensor::empty(Shape{B, H}, DType::f32), vd = Tensor::empty(Shape{B, kv / 2}, DType::f32);
    for (int64_t b = 0; b < B; ++b)
      u.select(b).copy_from(m.layer_acts(l).u.select(b * T0 + T0 - 1));
    ops::linear_forward(vd, u, m.layer_param_views(l).w_qkv.slice(C + kv / 2, C + kv), Tensor{});
    return vd;
  };
  auto same = [](const Tensor& a, const Tensor& b) { return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0; };
  for (DType gemm : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(gemm == DType::f32 ? "f32 GEMMs" : "bf16 GEMMs");
    ZayaModel m(c, B, T0);
    test::randomize(m, 23, 3.0f);
    m.set_gemm_dtype(gemm);
    ZayaDecoder dec(m, B, T0 + 4);
    Tensor logits = Tensor::empty(Shape{B, c.vocab_size}, DType::f32);
    dec.prefill(prompt, logits);
    for (int l = gemm == DType::f32 ? 0 : c.num_hidden_layers - 1; l < c.num_hidden_layers; ++l)
      EXPECT_TRUE(same(dec.cache(l).vd_prev, vd_from_saved_u(m, l))) << "layer " << l;
    if (gemm == DType::f32) continue;
    GenerateOptions opt;
    opt.max_new = 8;
    const auto tokens_f32 = generate(m, prompt, opt);
    std::vector<Tensor> caches;
    for (int l = 0; l < c.num_hidden_layers; ++l) caches.push_back(dec.cache(l).vd_prev.to(Device::cpu));
    m.set_activation_dtype(DType::bf16);
    ZayaDecoder dec16(m, B, T0 + 4);
    Tensor logits16 = Tensor::empty(Shape{B, c.vocab_size}, DType::f32);
    dec16.prefill(prompt, logits16);
    EXPECT_TRUE(same(logits16, logits));
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_TRUE(same(dec16.cache(l).vd_prev, caches[static_cast<size_t>(l)])) << "layer " << l;
      EXPECT_TRUE(same(dec16.cache(l).k, dec.cache(l).k) && same(dec16.cache(l).v, dec.cache(l).v) &&
                  same(dec16.cache(l).conv, dec.cache(l).conv))
          << "layer " << l;
    }
    EXPECT_EQ(generate(m, prompt, opt), tokens_f32);
  }
}

}  // namespace
}  // namespace zaya::model
