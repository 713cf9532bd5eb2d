// ZayaModel: full-model gradient check against central finite differences, determinism (runs and
// thread counts), the activation arena, and user errors. Bitwise agreement with transformers is
// tests/python/test_hf_parity.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/experts_cpu.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"

namespace zaya::model {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 24;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.num_experts = 3;
  c.moe_intermediate_size = 8;
  c.router_hidden_size = 8;
  c.max_position_embeddings = 64;
  return c;
}

// Init, then move every vector off its trivial value (scales 1, biases 0, temp 1) and give the
// matrices a std large enough that attention and routing depend on the input.
void randomize(ZayaModel& m, uint64_t seed) {
  m.init(seed);
  for (size_t i = 0; i < m.specs().size(); ++i) {
    Tensor t = m.param(static_cast<int>(i));
    const ParamSpec& s = m.specs()[i];
    if (s.shape.ndim() >= 2) {
      fill_normal(t, seed + 1000 + i, 0, 0.0f, 1.0f / std::sqrt(static_cast<float>(s.shape[s.shape.ndim() - 1])));
    } else if (s.init == InitKind::zeros) {
      fill_normal(t, seed + 1000 + i, 0, 0.0f, 0.1f);
    } else {
      fill_uniform(t, seed + 1000 + i, 0, 0.6f, 1.4f);
    }
  }
  // Balancing biases: small and varied; the skip class competes.
  Tensor beta = m.balancing_biases();
  fill_normal(beta, seed + 7, 0, 0.0f, 0.05f);
}

struct Batch {
  std::vector<int32_t> ids, targets;
  Tensor tid, ttg;
};

Batch make_batch(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
  Batch b;
  Tensor u = Tensor::empty(Shape{B * T}, DType::f32);
  fill_uniform(u, seed, 0);
  for (int64_t i = 0; i < B * T; ++i)
    b.ids.push_back(static_cast<int32_t>(u.data<float>()[i] * static_cast<float>(c.vocab_size - 1)));
  b.ids[1] = 0;  // the padding id
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) b.targets.push_back(t + 1 < T ? b.ids[r * T + t + 1] : -100);
  b.tid = Tensor::borrow(b.ids.data(), Shape{B, T}, DType::i32);
  b.ttg = Tensor::borrow(b.targets.data(), Shape{B, T}, DType::i32);
  return b;
}

std::vector<int32_t> choices(const ZayaModel& m) {
  std::vector<int32_t> out;
  for (int l = 0; l < m.config().num_hidden_layers; ++l) {
    Tensor c = m.router_choice(l);
    out.insert(out.end(), c.data<int32_t>(), c.data<int32_t>() + c.numel());
  }
  return out;
}

// Directional derivative check per parameter: for a random direction d on one parameter,
// ⟨∇L, d⟩ against (L(θ + εd) − L(θ − εd)) / 2ε. The loss is an fp32 computation returned as
// double: its rounding noise is ~1e-7·|L| ≈ 3e-7, which the difference quotient divides by 2ε =
// 2e-2, i.e. ~2e-5 absolute; the O(ε²) truncation term is of the same order with ε = 1e-2 and
// these O(1) curvatures. Hence |num − ana| ≤ 2e-3 + 2e-2·|ana|. A perturbation that flips a
// routing decision makes the loss non-differentiable there: such samples are skipped (and counted).
// Returns the number of token-layer pairs the skip class won at the base point.
int64_t expect_gradients_match_finite_differences(const ModelConfig& c, float skip_bias) {
  const int64_t B = 2, T = 6;
  ZayaModel m(c, B, T);
  randomize(m, 11);
  if (skip_bias != 0)  // raise the skip class's balancing bias in every layer
    for (int l = 0; l < c.num_hidden_layers; ++l) m.balancing_biases().select(l).data<float>()[c.num_experts] += skip_bias;
  Batch b = make_batch(c, B, T, 5);
  m.zero_grad();
  double loss = m.forward(b.tid, b.ttg);
  m.backward();
  EXPECT_TRUE(std::isfinite(loss));
  if (!std::isfinite(loss)) return 0;
  std::vector<int32_t> base_choice = choices(m);

  int checked = 0, skipped = 0, nonzero = 0;
  for (size_t i = 0; i < m.specs().size(); ++i) {
    Tensor p = m.param(static_cast<int>(i));
    Tensor g = m.grad(static_cast<int>(i));
    Tensor d = Tensor::empty(p.shape(), DType::f32);
    fill_normal(d, 77, i * 4096, 0.0f, 1.0f);
    // The padding row's lookup gradient is 0 by definition (as transformers' padding_idx), not the
    // derivative: the direction leaves that row alone (the batch looks it up at position 1).
    if (m.specs()[i].name == "model.embed_tokens.weight")
      std::fill_n(d.data<float>() + c.pad_token_id * c.hidden_size, c.hidden_size, 0.0f);
    double ana = 0;
    for (int64_t k = 0; k < p.numel(); ++k) ana += double(g.data<float>()[k]) * d.data<float>()[k];
    Tensor saved = p.clone();
    const float eps = 1e-2f;
    double lp = 0, lm = 0;
    bool same_route = true;
    for (int sgn : {+1, -1}) {
      for (int64_t k = 0; k < p.numel(); ++k)
        p.data<float>()[k] = saved.data<float>()[k] + sgn * eps * d.data<float>()[k];
      double l = m.forward(b.tid, b.ttg, /*for_backward=*/false);
      same_route = same_route && choices(m) == base_choice;
      (sgn > 0 ? lp : lm) = l;
    }
    p.copy_from(saved);
    if (!same_route) {
      ++skipped;
      continue;
    }
    double num = (lp - lm) / (2.0 * eps);
    EXPECT_NEAR(num, ana, 2e-3 + 2e-2 * std::fabs(ana)) << m.specs()[i].name;
    ++checked;
    if (std::fabs(ana) > 1e-3) ++nonzero;
  }
  EXPECT_GE(checked, static_cast<int>(m.specs().size()) * 3 / 4) << "skipped " << skipped;
  EXPECT_GE(nonzero, checked / 2) << "most parameters must carry gradient in this test";
  int64_t skip_wins = 0;
  for (int32_t e : base_choice) skip_wins += e == c.num_experts;
  return skip_wins;
}

TEST(ZayaModel, GradientMatchesFiniteDifferencesForEveryParameter) {
  expect_gradients_match_finite_differences(tiny(), 0.0f);
}

// The legacy skip passthrough (ModelConfig::skip_passthrough): a skipped token's MoE output is
// p_skip times its normalized input, so its gradient reaches the post-attention norm (and all
// below) through both the passthrough and the router (p_skip). The skip bias is raised so that
// the skip class wins for a good share of the tokens in every run, and loses for the rest.
TEST(ZayaModel, GradientMatchesFiniteDifferencesWithSkipPassthrough) {
  ModelConfig c = tiny();
  c.skip_passthrough = true;
  const int64_t wins = expect_gradients_match_finite_differences(c, 0.15f);
  EXPECT_GE(wins, 4) << "the skip class must win for several tokens";
  EXPECT_LE(wins, 2 * 2 * 6 - 4) << "and lose for several";
}

// The tied head still gives the padding row (id 0) gradient even though its lookup does not
// (that the lookup adds nothing is checked against torch's nn.Embedding(padding_idx) in
// tests/python/test_hf_parity.py, whose sequences contain id 0).
TEST(ZayaModel, PaddingRowStillGetsTheHeadGradient) {
  ModelConfig c = tiny();
  ZayaModel m(c, 1, 4);
  randomize(m, 3);
  std::vector<int32_t> ids{5, 0, 7, 9}, tg{0, 7, 9, -100};
  Tensor tid = Tensor::borrow(ids.data(), Shape{1, 4}, DType::i32);
  Tensor ttg = Tensor::borrow(tg.data(), Shape{1, 4}, DType::i32);
  m.zero_grad();
  m.forward(tid, ttg);
  m.backward();
  Tensor row0 = m.grad("model.embed_tokens.weight").select(0);
  double norm = 0;
  for (int64_t j = 0; j < c.hidden_size; ++j) norm += std::fabs(row0.data<float>()[j]);
  EXPECT_GT(norm, 1e-4);
}

// Also at 2,048 tokens: the weight gradients' reduction runs over the tokens, and with few outputs
// (the router's 8×8 here, 64×64 in the demo) oneDNN split it among the threads, which changed the
// bits on 2 threads until such products were kept on one (ops/gemm.cc, reduction_may_split).
TEST(ZayaModel, DeterministicAcrossRunsAndThreadCounts) {
  for (auto [B, T] : {std::pair<int64_t, int64_t>{2, 7}, {32, 64}}) {
    SCOPED_TRACE(std::to_string(B) + " x " + std::to_string(T) + " tokens");
    ModelConfig c = tiny();
    Batch b = make_batch(c, B, T, 9);
    auto run = [&](int threads, std::vector<float>& grads) {
      set_num_threads(threads);
      ZayaModel m(c, B, T);
      randomize(m, 21);
      double loss = m.forward(b.tid, b.ttg);
      m.backward();
      grads.assign(m.grads_flat().data<float>(), m.grads_flat().data<float>() + m.grads_flat().numel());
      return loss;
    };
    const int saved = num_threads();
    std::vector<float> g1, g2, g3;
    double l1 = run(2, g1), l2 = run(2, g2), l3 = run(1, g3);
    set_num_threads(saved);
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(l1, l3);
    EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), g1.size() * 4));
    EXPECT_EQ(0, std::memcmp(g1.data(), g3.data(), g1.size() * 4));
  }
}

// Routing so uneven that a grouped call cannot share its experts out among the threads (here the
// balancing biases send every token to expert 0, as the demo's router did to a layer at step 21),
// with the shapes at which oneDNN's own threading of the grouped kernel changed the bits: the
// down projection x·Wᵀ with K = 1024 (moe_intermediate_size) and a small weight. Fused or grouped,
// 2 threads must give the one-thread bits (ops/gemm_grouped.cc, run_grouped_problem's row pieces).
TEST(ZayaModel, DeterministicAcrossThreadCountsWhenOneExpertTakesEveryToken) {
  ModelConfig c = tiny();
  c.hidden_size = 128;
  c.moe_intermediate_size = 1024;
  c.num_experts = 4;
  c.num_hidden_layers = 1;
  const int64_t B = 4, T = 64;
  Batch b = make_batch(c, B, T, 3);
  auto run = [&](int threads, bool fused, std::vector<float>& grads) {
    set_num_threads(threads);
    ZayaModel m(c, B, T);
    m.init(5);
    ops::cpu::set_fused_experts(fused);
    struct Restore {
      ~Restore() { ops::cpu::set_fused_experts(true); }
    } restore;
    float* beta = m.balancing_biases().data<float>();
    beta[0] = 4.0f;  // expert 0 of the only layer: far above the router's logits at init
    const double loss = m.forward(b.tid, b.ttg);
    m.backward();
    EXPECT_EQ(m.router_stats()[0].tokens_per_expert[0], B * T)
        << "the biases did not send every token to expert 0";
    grads.assign(m.grads_flat().data<float>(), m.grads_flat().data<float>() + m.grads_flat().numel());
    return loss;
  };
  const int saved = num_threads();
  std::vector<float> g1, g2, g2_grouped;
  const double l1 = run(1, true, g1), l2 = run(2, true, g2), l2_grouped = run(2, false, g2_grouped);
  set_num_threads(saved);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(l1, l2_grouped);
  EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), g1.size() * 4));
  EXPECT_EQ(0, std::memcmp(g1.data(), g2_grouped.data(), g1.size() * 4));
}

// The experts' fused way (one task per expert) and grouped way (one pass per step over all
// experts) run the same one-thread GEMMs on the same rows: same loss, same gradient bits. The
// GEMM shape profile shows which way ran, so the test fails if the fused way never did. On more
// threads than experts (6 for 4 here; zaya_experts.cc, plan_fused_experts) the backward takes the
// fused way whatever the loads, and the forward cuts the experts into row pieces (on the default
// GEMM paths; grouped on the AVX2-only ones): the same bits again. 512 tokens over 4 experts, so
// that some expert has the 128 rows that the 6-thread forward cuts in two.
TEST(ZayaModel, FusedAndGroupedExpertsGiveTheSameBits) {
  ModelConfig c = tiny();
  c.num_experts = 4;
  c.hidden_size = 32;
  c.moe_intermediate_size = 24;
  const int64_t B = 8, T = 64;
  Batch b = make_batch(c, B, T, 5);
  struct Ran {
    bool fwd = false, bwd = false;
    int64_t most_rows = 0;  // the largest expert's rows in any layer
  };
  auto run = [&](int threads, bool fused, std::vector<float>& grads, Ran& ran) {
    set_num_threads(threads);
    ZayaModel m(c, B, T);
    m.init(33);  // the documented init: its router spreads tokens over the experts
    ops::cpu::set_fused_experts(fused);
    struct Restore {
      ~Restore() { ops::cpu::set_fused_experts(true); }
    } restore;
    ops::cpu::gemm_time_reset();
    ops::cpu::gemm_profile_shapes(true);
    double loss = m.forward(b.tid, b.ttg);
    m.backward();
    ops::cpu::gemm_profile_shapes(false);
    for (const ops::cpu::GemmShapeTime& r : ops::cpu::gemm_shape_times()) {
      ran.fwd |= r.shape.find("fused experts forward") != std::string::npos;
      ran.bwd |= r.shape.find("fused experts backward") != std::string::npos;
    }
    for (const RouterStats& st : m.router_stats())
      for (int64_t n : st.tokens_per_expert) ran.most_rows = std::max(ran.most_rows, n);
    grads.assign(m.grads_flat().data<float>(), m.grads_flat().data<float>() + m.grads_flat().numel());
    return loss;
  };
  const int saved = num_threads();
  // Both GEMM path families: the default, and the AVX2-only CPUs' shape-fixed pieces (forced).
  for (bool avx2 : {false, true}) {
    SCOPED_TRACE(avx2 ? "AVX2 paths forced" : "default GEMM paths");
    ops::cpu::gemm_force_avx2_paths(avx2);
    std::vector<float> g_fused, g_grouped, g_one, g_many;
    Ran r_fused, r_grouped, r_one, r_many;
    const double l_fused = run(2, true, g_fused, r_fused), l_grouped = run(2, false, g_grouped, r_grouped),
                 l_one = run(1, true, g_one, r_one), l_many = run(6, true, g_many, r_many);
    ops::cpu::gemm_force_avx2_paths(false);
    ASSERT_TRUE(r_fused.fwd && r_fused.bwd)
        << "the fused way did not run on 2 threads (its plan rejected this routing)";
    EXPECT_FALSE(r_grouped.fwd || r_grouped.bwd);
    EXPECT_FALSE(r_one.fwd || r_one.bwd);  // one thread: the grouped way
    EXPECT_TRUE(r_many.bwd) << "the backward did not take the fused way on more threads than experts";
    EXPECT_EQ(r_many.fwd, !avx2) << "6 threads: the forward's row pieces on the default paths only";
    EXPECT_GE(r_many.most_rows, 128)
        << "no expert big enough to be cut on 6 threads: the test lost its point";
    EXPECT_EQ(l_fused, l_grouped);
    EXPECT_EQ(l_fused, l_one);
    EXPECT_EQ(l_fused, l_many);
    EXPECT_EQ(0, std::memcmp(g_fused.data(), g_grouped.data(), g_fused.size() * 4));
    EXPECT_EQ(0, std::memcmp(g_fused.data(), g_one.data(), g_fused.size() * 4));
    EXPECT_EQ(0, std::memcmp(g_fused.data(), g_many.data(), g_fused.size() * 4));
  }
  set_num_threads(saved);
}

TEST(ZayaModel, InitIsSeededPerParameterAndFollowsSpecs) {
  ModelConfig c = tiny();
  ZayaModel a(c, 1, 2), b(c, 1, 2), d(c, 1, 2);
  a.init(1);
  b.init(1);
  d.init(2);
  EXPECT_EQ(0, std::memcmp(a.params_flat().raw(), b.params_flat().raw(), a.params_flat().nbytes()));
  EXPECT_NE(0, std::memcmp(a.params_flat().raw(), d.params_flat().raw(), a.params_flat().nbytes()));
  EXPECT_EQ(a.param("model.layers.1.post_mlp_residual_scale.residual_scale").data<float>()[3], 1.0f);
  EXPECT_EQ(a.param("model.layers.0.mlp.gate.down_proj.bias").data<float>()[2], 0.0f);
  EXPECT_EQ(a.param("model.layers.0.self_attn.qk_norm.temp").data<float>()[0], float(c.key_temperature_init));
  EXPECT_EQ(a.balancing_biases().data<float>()[c.num_experts], -1.0f);
  // The padding row starts at zero; other rows are N(0, 0.02²).
  EXPECT_EQ(a.param("model.embed_tokens.weight").data<float>()[0], 0.0f);
  double s2 = 0;
  Tensor e = a.param("model.embed_tokens.weight");
  for (int64_t k = c.hidden_size; k < e.numel(); ++k) s2 += double(e.data<float>()[k]) * e.data<float>()[k];
  // Sample std of ~370 normals: within 15% of 0.02 (4+ standard errors of the estimate).
  EXPECT_NEAR(std::sqrt(s2 / double(e.numel() - c.hidden_size)), 0.02, 0.003);
  // Parameters are views into the flat buffer, in spec order.
  EXPECT_EQ(a.param(0).raw(), a.params_flat().raw());
  EXPECT_THROW(a.param("model.layers.9.nope"), Error);
}

TEST(ZayaModel, ArenaHoldsExactlyThePlannedActivations) {
  ModelConfig c = tiny();
  const int64_t B = 4, T = 16, N = B * T;
  ZayaModel m(c, B, T);
  randomize(m, 4);
  Batch b = make_batch(c, B, T, 2);
  m.forward(b.tid, b.ttg);
  m.backward();  // would throw "arena exhausted" if the plan were short
  // Saved per layer and token (docs/model.md): f32 rows of 7H + 3C + kv + q + 6R + (E+1) + 3I + 3
  // (rstd ×3), nq (attention lse), weight, and 3 i32 (choice, pos, src); plus per-layer
  // counts/offsets and ≤ 64 bytes of alignment for each of the 33 tensors. With N = 64 that slack
  // is ~34 bytes per token, less than one missing or extra H row (64 bytes), so the bound is tight.
  const int64_t H = c.hidden_size, C = c.conv_channels(), R = c.router_hidden_size, I = c.moe_intermediate_size;
  const int64_t per_token = 4 * (7 * H + 3 * C + c.kv_dim() + c.q_dim() + 6 * R + c.router_classes() + 3 * I + 3 +
                                 c.num_attention_heads + 1 + 3);
  const double slack = (33.0 * 64 + 4.0 * (2 * c.num_experts + 1)) / double(N);
  EXPECT_GE(m.saved_bytes_per_token_per_layer(), double(per_token));
  EXPECT_LE(m.saved_bytes_per_token_per_layer(), double(per_token) + slack);
  EXPECT_GT(m.activation_bytes(), size_t(c.num_hidden_layers * per_token * N));
}

TEST(ZayaModel, UserErrorsThrow) {
  ModelConfig c = tiny();
  ZayaModel m(c, 2, 3);
  m.init(1);
  std::vector<int32_t> ids(6, 1), bad(6, 1);
  bad[4] = static_cast<int32_t>(c.vocab_size);
  Tensor wrong = Tensor::borrow(ids.data(), Shape{3, 2}, DType::i32);
  EXPECT_THROW(m.forward(wrong), Error);
  Tensor out_of_range = Tensor::borrow(bad.data(), Shape{2, 3}, DType::i32);
  EXPECT_THROW(m.forward(out_of_range), Error);
  EXPECT_THROW(m.backward(), Error);  // no forward with targets yet
  Tensor logits = Tensor::empty(Shape{6, c.vocab_size + 1}, DType::f32);
  EXPECT_THROW(m.forward_logits(Tensor::borrow(ids.data(), Shape{2, 3}, DType::i32), logits), Error);
  ModelConfig broken = c;
  broken.num_attention_heads = 3;  // not a multiple of nkv = ... (validate rejects)
  broken.num_key_value_heads = 2;
  EXPECT_THROW(ZayaModel(broken, 1, 1), Error);
  EXPECT_THROW(ZayaModel(c, 0, 4), Error);
}

TEST(ZayaModel, LogitsAgreeWithTheFusedLoss) {
  ModelConfig c = tiny();
  const int64_t B = 1, T = 6;
  ZayaModel m(c, B, T);
  randomize(m, 8);
  Batch b = make_batch(c, B, T, 3);
  Tensor logits = Tensor::empty(Shape{B * T, c.vocab_size}, DType::f32);
  m.forward_logits(b.tid, logits);
  double ce = 0;
  int n = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (b.targets[t] < 0) continue;
    const float* z = logits.data<float>() + t * c.vocab_size;
    double mx = z[0], s = 0;
    for (int64_t v = 1; v < c.vocab_size; ++v) mx = std::max(mx, double(z[v]));
    for (int64_t v = 0; v < c.vocab_size; ++v) s += std::exp(z[v] - mx);
    ce += mx + std::log(s) - z[b.targets[t]];
    ++n;
  }
  double loss = m.forward(b.tid, b.ttg, false);
  // Same f32 logits up to GEMM blocking; the CE is an average of O(3) values: 1e-5 relative.
  EXPECT_NEAR(loss, ce / n, 1e-5 * std::fabs(loss));
}

// A batch of sequences is that many independent sequences: nothing of one row (the CCA
// convolutions' and the value shift's previous tokens, the causal attention, the routing) reaches
// another, forward or backward. Each row run alone (B = 1, the same weights) must give the same
// logits and routing, and the batch's mean-loss gradient must be the mean of the rows' (every row
// has T − 1 targets, so the batch mean weights them equally). Bounds: 1e-5 relative, for fp32 sums
// in another blocking (the GEMMs see M = 3T against T rows); a leak across rows moves results at
// the 1e-2 level.
TEST(ZayaModel, BatchRowsAreIndependentSequences) {
  ModelConfig c = tiny();
  const int64_t B = 3, T = 9;
  ZayaModel mb(c, B, T), m1(c, 1, T);
  randomize(mb, 21);
  randomize(m1, 21);
  Batch b = make_batch(c, B, T, 5);
  Tensor logits = Tensor::empty(Shape{B * T, c.vocab_size}, DType::f32);
  mb.forward_logits(b.tid, logits);
  mb.zero_grad();
  mb.forward(b.tid, b.ttg, true);
  mb.backward();
  const std::vector<int32_t> batch_choice = choices(mb);
  std::vector<std::vector<float>> row_grad_sum(mb.specs().size());
  for (int64_t r = 0; r < B; ++r) {
    Tensor ids = Tensor::borrow(b.ids.data() + r * T, Shape{1, T}, DType::i32);
    Tensor tg = Tensor::borrow(b.targets.data() + r * T, Shape{1, T}, DType::i32);
    Tensor row = Tensor::empty(Shape{T, c.vocab_size}, DType::f32);
    m1.forward_logits(ids, row);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < T * c.vocab_size; ++i) {
      const double x = logits.data<float>()[r * T * c.vocab_size + i], y = row.data<float>()[i];
      diff = std::max(diff, std::fabs(x - y));
      norm = std::max(norm, std::fabs(y));
    }
    EXPECT_LE(diff, 1e-5 * norm) << "row " << r << ": logits differ from the row run alone";
    m1.zero_grad();
    m1.forward(ids, tg, true);
    m1.backward();
    const std::vector<int32_t> row_choice = choices(m1);
    for (int l = 0; l < c.num_hidden_layers; ++l)
      for (int64_t t = 0; t < T; ++t)
        EXPECT_EQ(batch_choice[l * B * T + r * T + t], row_choice[l * T + t])
            << "layer " << l << " row " << r;
    for (size_t i = 0; i < mb.specs().size(); ++i) {
      const Tensor& g = m1.grad(static_cast<int>(i));
      row_grad_sum[i].resize(static_cast<size_t>(g.numel()), 0.0f);
      for (int64_t k = 0; k < g.numel(); ++k) row_grad_sum[i][k] += g.data<float>()[k];
    }
  }
  for (size_t i = 0; i < mb.specs().size(); ++i) {
    const Tensor& g = mb.grad(static_cast<int>(i));
    double diff = 0, norm = 0;
    for (int64_t k = 0; k < g.numel(); ++k) {
      const double want = row_grad_sum[i][k] / static_cast<double>(B);
      diff += (g.data<float>()[k] - want) * (g.data<float>()[k] - want);
      norm += want * want;
    }
    EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm) + 1e-9) << mb.specs()[i].name;
  }
}

}  // namespace
}  // namespace zaya::model
