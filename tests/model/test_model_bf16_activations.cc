// bf16 saved activations (ZayaModel::set_activation_dtype): each layer keeps only bf16 copies of
// the experts' gate/up output gu and output y, of the residual scalings' h (o and m), and of the
// sequence ops' saved tensors (the conv input z, the QK-norm inputs qpre and kpre, the attention's
// inputs qr, kr, v and its output att, whose copy is the o_proj GEMM's att16); the f32 values are
// shared buffers the forward computes from. So the forward and the loss are bitwise those of f32
// activations (with the same bf16 GEMMs), the backward reads the rounded values (the SwiGLU's
// backward gu, the combine's backward y, the residual scalings' ds_h o and m, and the CCA and
// attention backwards z ... att, widened into their shared f32 scratch), the gradients move by a
// bounded amount, and each layer saves 2 bytes per element of gu, y, o, m, z, qpre, kpre, qr, kr
// and v, and 4 per element of att.
// (test_activation_bf16_residual.cc: what the backward and the decoder read of o, m and u.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <vector>

#include "device_or_emulated.h"
#include "model/random_model.h"
#include "zaya/core/error.h"
#include "zaya/model/model_internal.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/dense.h"

namespace zaya::model {
namespace {

struct Step {
  double loss;
  std::vector<float> grads;
};

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed, Device device) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + seed * 13) % V);
  return t.to(device);
}

Step train_step(ZayaModel& m, const Tensor& ids, const Tensor& tg) {
  m.zero_grad();
  Step s;
  s.loss = m.forward(ids, tg);
  m.backward();
  const Tensor g = m.grads_flat().to(Device::cpu);
  s.grads.assign(g.data<float>(), g.data<float>() + g.numel());
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double rel(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : std::sqrt(num / den);
}

// The bound on each parameter's gradient, norm-wise relative to the f32-activation step (the same
// bf16 GEMMs), and its derivation. The two steps are bitwise alike up to the first read of a
// rounded activation in the backward, so every difference starts at such a read. Per layer the
// backward reads eleven: gu16 in the SwiGLU's backward, y16 in dL/dweight = ⟨dm, y⟩, o16 and m16
// in the residual scalings' ds_h = Σ dy ⊙ (h + b_h), att16, qr16, kr16 and v16 in the attention's
// backward (D = rowsum(dO ⊙ O), the recomputed probabilities, dq = dS·K, dk = dSᵀ·Q, dP = dO·Vᵀ),
// qpre16 and kpre16 in the QK norm's backward and z16 in the conv's (dW = Σ dconv ⊗ z). A value
// rounded to nearest bf16 is off by ≤ 2^-8 relative (half an ulp of 8 significant bits), and each
// of those backwards carries it with a factor of order 1 (SwiGLU's 1 + g(1 − σ(g)); the QK norm's
// Jacobian, scale-free in its input; the attention's softmax, whose scores over normalized q and k
// stay of order 1), so each read moves what it computes by ≤ 2^-8 relative. From there the
// difference flows through the rest of the backward, and each bf16 rounding of a GEMM input the
// difference reaches (the experts' dgu16, the router's dlogits16, dg2_16, dg1_16 and dr16, the
// attention's dout_proj16, dz16 and dvcd16, the layer below's experts' dy16) may round the two
// values to neighbouring bf16 numbers: one more step of ≤ 2^-8. With the 11 reads and those 9
// roundings in each of L layers, independent, the steps add like a random walk: √(20·L)·2^-8; four
// times that bounds the spread (0.099 at L = 2, 0.121 at L = 3), as ModelBf16's bound does for the
// bf16 GEMMs. A gradient that read the f32 values, or bf16 copies of the wrong rows, would be
// unchanged (caught below: the gradients must differ, and the scratch the backward read must hold
// the rounded values) or off by O(1).
double gradient_bound(int64_t layers) { return 4.0 * std::sqrt(20.0 * static_cast<double>(layers)) / 256.0; }

// Every parameter's gradient of `b16` (bf16 activations) within the bound of `f32`'s, and the
// experts' gate/up gradients and the residual scalings' hidden_states_scale gradients different (the
// rounded gu and h reached them). Prints each with ZAYA_TEST_VERBOSE.
void expect_within_bound(const ZayaModel& m, const Step& b16, const Step& f32) {
  const bool verbose = std::getenv("ZAYA_TEST_VERBOSE") != nullptr;
  const double tol = gradient_bound(m.config().num_hidden_layers);
  double worst = 0;
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const int64_t off = m.param_offset(static_cast<int>(i)), n = m.specs()[i].shape.numel();
    const double e = rel(b16.grads.data() + off, f32.grads.data() + off, n);
    worst = std::max(worst, e);
    if (verbose) std::printf("%-60s %.3e\n", m.specs()[i].name.c_str(), e);
    EXPECT_LE(e, tol) << m.specs()[i].name;
    const std::string& name = m.specs()[i].name;
    if (name.find("experts.gate_up_proj") != std::string::npos ||
        name.find("residual_scale.hidden_states_scale") != std::string::npos) {
      EXPECT_NE(std::memcmp(b16.grads.data() + off, f32.grads.data() + off, static_cast<size_t>(n) * 4), 0)
          << name << ": the bf16 copy of what it reads did not reach it";
    }
  }
  if (verbose) std::printf("largest deviation %.3e, bound %.3e\n", worst, tol);
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
    {"three layers, skip passthrough", {6, 2, 8, 5, 3, 24, 40, 48, 300}, true, 2, 20, 13},
    {"three layers, chunked loss", {6, 2, 8, 5, 3, 24, 40, 48, 9000}, false, 2, 20, 17},
};

ModelConfig config_of(const Case& k) {
  ModelConfig c = test::small_config(k.dims, 64);
  c.skip_passthrough = k.passthrough;
  return c;
}

// On the CPU: the loss bitwise the f32-activation step's, every gradient within the bound and not
// all alike; with recompute the bf16-activation step is bitwise the one without (the re-run makes
// the same copies); switching back to f32 activations gives the f32-activation step again, bitwise.
TEST(Bf16Activations, LossBitwiseAndGradientsWithinTheBoundOfF32Activations) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(k.name);
    const ModelConfig c = config_of(k);
    ZayaModel m(c, k.B, k.T);
    test::randomize(m, k.seed, 2.0f);
    m.set_gemm_dtype(DType::bf16);
    const Tensor ids = tokens(k.B, k.T, c.vocab_size, 1, Device::cpu), tg = tokens(k.B, k.T, c.vocab_size, 2, Device::cpu);
    const Step f32 = train_step(m, ids, tg);
    m.set_activation_dtype(DType::bf16);
    EXPECT_EQ(m.activation_dtype(), DType::bf16);
    const Step b16 = train_step(m, ids, tg);
    EXPECT_EQ(std::memcmp(&b16.loss, &f32.loss, sizeof(double)), 0) << b16.loss << " vs " << f32.loss;
    EXPECT_FALSE(same_bits(b16.grads, f32.grads));
    expect_within_bound(m, b16, f32);
    m.set_recompute(true);
    const Step re = train_step(m, ids, tg);
    EXPECT_EQ(std::memcmp(&re.loss, &b16.loss, sizeof(double)), 0);
    EXPECT_TRUE(same_bits(re.grads, b16.grads)) << "recompute changed a gradient";
    m.set_recompute(false);
    m.set_activation_dtype(DType::f32);
    const Step back = train_step(m, ids, tg);
    EXPECT_EQ(std::memcmp(&back.loss, &f32.loss, sizeof(double)), 0);
    EXPECT_TRUE(same_bits(back.grads, f32.grads));
  }
  ZayaModel f32_gemms(test::small_config(kCases[0].dims, 64), 2, 8);
  EXPECT_THROW(f32_gemms.set_activation_dtype(DType::bf16), Error) << "bf16 activations need bf16 GEMMs";
}

// The same on the device (a GPU, else the emulated device: placement): a CPU-randomized model's
// parameters copied into two device models, f32 and bf16 activations, both with bf16 GEMMs. The
// forward computes from the same f32 values either way, so the losses are bitwise alike there too.
TEST(Bf16Activations, LossBitwiseAndGradientsWithinTheBoundOnTheDevice) {
  ZAYA_GPU_OR_EMULATED(real);
  const Case& k = kCases[1];
  const ModelConfig c = config_of(k);
  ZayaModel host(c, k.B, k.T);
  test::randomize(host, k.seed, 2.0f);
  std::unique_ptr<ZayaModel> m[2];
  for (int i = 0; i < 2; ++i) {
    m[i] = std::make_unique<ZayaModel>(c, k.B, k.T, Device::cuda);
    Tensor(m[i]->params_flat()).copy_from(host.params_flat());
    Tensor(m[i]->balancing_biases()).copy_from(host.balancing_biases());
    m[i]->set_gemm_dtype(DType::bf16);
  }
  m[1]->set_activation_dtype(DType::bf16);
  const Tensor ids = tokens(k.B, k.T, c.vocab_size, 1, Device::cuda), tg = tokens(k.B, k.T, c.vocab_size, 2, Device::cuda);
  const Step f32 = train_step(*m[0], ids, tg), b16 = train_step(*m[1], ids, tg);
  EXPECT_EQ(std::memcmp(&b16.loss, &f32.loss, sizeof(double)), 0) << b16.loss << " vs " << f32.loss;
  EXPECT_FALSE(same_bits(b16.grads, f32.grads));
  expect_within_bound(*m[1], b16, f32);
}

// The shared f32 buffers of bf16 saved activations, and each layer's bf16 copies of them.
using Field = Tensor LayerActs::*;
struct Saved {
  const char* name;
  Field f32, bf16;
};
const Saved kSaved[] = {
    {"gu", &LayerActs::gu, &LayerActs::gu16},       {"y", &LayerActs::y, &LayerActs::y16},
    {"z", &LayerActs::z, &LayerActs::z16},          {"qpre", &LayerActs::qpre, &LayerActs::qpre16},
    {"kpre", &LayerActs::kpre, &LayerActs::kpre16}, {"qr", &LayerActs::qr, &LayerActs::qr16},
    {"kr", &LayerActs::kr, &LayerActs::kr16},       {"v", &LayerActs::v, &LayerActs::v16},
    {"att", &LayerActs::att, &LayerActs::att16},
};

// gu, y and the sequence ops' saved tensors (z, qpre, kpre, qr, kr, v, att) are one f32 buffer each
// for all layers, each layer has its own bf16 copies, and the backward reads only those (widened):
// with the shared f32 values poisoned (NaN) between the forward and the backward, the loss and
// every gradient stay bitwise those of the untouched step (tolerance 0; a read would carry NaN into
// some gradient).
TEST(Bf16Activations, BackwardReadsOnlyTheBf16Copies) {
  const Case& k = kCases[0];
  const ModelConfig c = config_of(k);
  ZayaModel m(c, k.B, k.T);
  test::randomize(m, k.seed, 2.0f);
  m.set_gemm_dtype(DType::bf16);
  m.set_activation_dtype(DType::bf16);
  for (const Saved& f : kSaved)
    for (int l = 1; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ((m.layer_acts(l).*f.f32).raw(), (m.layer_acts(0).*f.f32).raw()) << f.name << ", layer " << l;
      EXPECT_NE((m.layer_acts(l).*f.bf16).raw(), (m.layer_acts(0).*f.bf16).raw()) << f.name << ", layer " << l;
      EXPECT_EQ((m.layer_acts(l).*f.bf16).dtype(), DType::bf16) << f.name;
    }
  const Tensor ids = tokens(k.B, k.T, c.vocab_size, 3, Device::cpu), tg = tokens(k.B, k.T, c.vocab_size, 4, Device::cpu);
  auto step = [&](bool poison) {
    m.zero_grad();
    Step s;
    s.loss = m.forward(ids, tg);
    if (poison)
      for (const Saved& f : kSaved) Tensor(m.layer_acts(0).*f.f32).fill_(std::nan(""));
    m.backward();
    const float* g = m.grads_flat().data<float>();
    s.grads.assign(g, g + m.grads_flat().numel());
    return s;
  };
  const Step clean = step(false), poisoned = step(true);
  EXPECT_EQ(std::memcmp(&clean.loss, &poisoned.loss, sizeof(double)), 0);
  EXPECT_TRUE(same_bits(clean.grads, poisoned.grads)) << "the backward read a shared f32 buffer";
}

// What the sequence ops' backward reads is each layer's own forward values rounded to bf16: every
// layer's copies are bitwise bf16(the f32-activation forward's values of that layer) (the forward
// is bitwise alike in both modes), and after the backward the shared f32 scratch holds layer 0's
// copies widened, the last the backward read (tolerance 0: rounding and widening are exact
// functions of the forward's bits). Copies of the wrong layer or rows, or f32 values read where the
// rounded ones belong, fail here.
TEST(Bf16Activations, SequenceOpsBackwardReadsItsLayersRoundedValues) {
  const Case& k = kCases[1];
  const ModelConfig c = config_of(k);
  ZayaModel m(c, k.B, k.T);
  test::randomize(m, k.seed, 2.0f);
  m.set_gemm_dtype(DType::bf16);
  const Tensor ids = tokens(k.B, k.T, c.vocab_size, 5, Device::cpu), tg = tokens(k.B, k.T, c.vocab_size, 6, Device::cpu);
  auto rounded = [](const Tensor& x) {
    Tensor b = Tensor::empty(x.shape(), DType::bf16);
    ops::cast_to_bf16(b, x);
    return b;
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  const Saved* seq = kSaved + 2;  // z ... att
  const size_t n_seq = std::size(kSaved) - 2;
  m.forward(ids, tg);
  std::vector<std::vector<Tensor>> want(static_cast<size_t>(c.num_hidden_layers));  // bf16(layer l's f32 values)
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (size_t i = 0; i < n_seq; ++i) want[static_cast<size_t>(l)].push_back(rounded(m.layer_acts(l).*seq[i].f32));
  m.set_activation_dtype(DType::bf16);
  m.forward(ids, tg);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (size_t i = 0; i < n_seq; ++i)
      EXPECT_TRUE(same(m.layer_acts(l).*seq[i].bf16, want[static_cast<size_t>(l)][i])) << seq[i].name << ", layer " << l;
  m.backward();
  for (size_t i = 0; i < n_seq; ++i) {
    const Tensor& scratch = m.layer_acts(0).*seq[i].f32;
    Tensor widened = Tensor::empty(scratch.shape(), DType::f32);
    ops::cast_to_f32(widened, want[0][i]);
    EXPECT_TRUE(same(scratch, widened)) << seq[i].name;
  }
}

// Per layer and token, bf16 activations save 2 bytes for each element of gu (2I), y (H), o (H), m
// (H), z (C), qpre (q), kpre (kv), qr (q), kr (kv) and v (kv), and 4 for each of att (q: its bf16
// copy att16 is the o_proj GEMM's already) against f32 activations with the same bf16 GEMMs:
// 4I + 6H + 2C + 8q + 6kv bytes, exactly, with recompute off and on (the one shared set shrinks
// alike). N = 64 rows: every block a multiple of the arena's 64-byte alignment, so no padding
// blurs the sums. ZAYA1-base (H = I = 2048, C = 1280, q = 1024, kv = 256): 32,768 bytes per token
// per layer.
TEST(Bf16Activations, SavedBytesPerLayerShrinkByTheRoundedCopies) {
  const ModelConfig c = config_of(kCases[0]);
  const int64_t B = 2, T = 32, N = B * T, H = c.hidden_size, I = c.moe_intermediate_size, C = c.conv_channels(),
                q = c.q_dim(), kv = c.kv_dim();
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "saved activations");
    ZayaModel m(c, B, T);
    m.set_recompute(recompute);
    m.set_gemm_dtype(DType::bf16);
    const double f32 = m.saved_bytes_per_token_per_layer() * static_cast<double>(N);
    m.set_activation_dtype(DType::bf16);
    // gu [N, 2I], y, o and m [N, H], z [N, C], qpre and qr [N, q], kpre, kr and v [N, kv]: 4 → 2
    // bytes each; att [N, q]: 4 → 0
    const double halved = static_cast<double>(N * (2 * 2 * I + 3 * 2 * H + 2 * C + 2 * 2 * q + 3 * 2 * kv + 4 * q));
    EXPECT_EQ(m.saved_bytes_per_token_per_layer() * static_cast<double>(N), f32 - halved);
  }
}

}  // namespace
}  // namespace zaya::model
