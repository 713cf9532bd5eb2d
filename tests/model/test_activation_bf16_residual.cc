// bf16 saved activations (ZayaModel::set_activation_dtype) for the residual scalings' h (the
// attention's o_proj output o and the MoE output m), and the bf16 GEMM mode's staging of the input
// norm's output u: the forward computes from the f32 values (shared scratch), each layer keeps bf16
// copies, the backward reads those. The reference is the same model with f32 activations and bf16
// GEMMs.
//
// Here: that the backward reads none of the shared f32 values, and that the cached decoder reads
// no saved u. The loss, the gradients' bound and the bytes saved with bf16 activations are
// test_model_bf16_activations.cc's.
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

struct Step {
  double loss;
  std::vector<float> grads;
};

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  return {h.data<float>(), h.data<float>() + h.numel()};
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed, Device device = Device::cpu) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + seed * 13) % V);
  return t.to(device);
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
