// Cached decode (ZayaDecoder) against the full forward, and sampling (greedy, temperature, top-p):
// determinism for a seed, the distribution it samples from, eos handling, user errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "model/random_model.h"
#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/model/generate.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"

namespace zaya::model {
namespace {

using Shape9 = test::ModelDims;
ModelConfig make_config(const Shape9& s) { return test::small_config(s, 128, 1000.0); }  // θ 1000: rotation visible in short sequences
void randomize(ZayaModel& m, uint64_t seed) { test::randomize(m, seed, 3.0f); }

double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Shapes: GQA (G = 2), nkv = 1 (the single head is [current half | previous half]), nq = nkv (G = 1),
// odd nkv = 3 (one head straddles the current/previous halves), a 3-layer EDA chain.
const Shape9 kShapes[] = {
    {4, 2, 16, 4, 2, 16, 24, 32, 96},
    {4, 1, 32, 8, 3, 16, 32, 48, 64},
    {2, 2, 16, 2, 2, 8, 8, 32, 50},
    {6, 3, 16, 3, 2, 8, 16, 32, 40},
};

TEST(Decode, EveryStepEqualsFullForwardOverThePrefix) {
  // Tolerance 1e-5 relative (the contract): decode and full forward run the same fp32 math, but the
  // attention sums keys in another order (one query vs 64×64 tiles) and the GEMMs see M = B instead
  // of M = B·T rows, which changes blocking; worst measured 1.2e-6. A wrong position, conv tap,
  // value shift or cache slot moves logits by > 1e-2.
  int si = 0;
  for (const Shape9& sh : kShapes) {
    ModelConfig c = make_config(sh);
    for (int64_t T0 : {1, 2, 5}) {
      const int64_t B = 2, total = 11;  // odd total length; prompt lengths 1 (no conv history), 2, 5
      ZayaModel m(c, B, total);
      randomize(m, 100 + si);
      std::vector<int32_t> seq(static_cast<size_t>(B * total));
      for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>((i * 37 + 11 * si + 5) % c.vocab_size);
      // References first: logits of the last position of forward_logits over the first t+1 tokens.
      std::vector<std::vector<float>> ref(static_cast<size_t>(total));
      for (int64_t t = T0 - 1; t < total; ++t) {
        std::vector<int32_t> pre;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j <= t; ++j) pre.push_back(seq[b * total + j]);
        m.set_batch_shape(B, t + 1);
        Tensor lg = Tensor::empty(Shape{B * (t + 1), c.vocab_size}, DType::f32);
        m.forward_logits(Tensor::borrow(pre.data(), Shape{B, t + 1}, DType::i32), lg);
        for (int64_t b = 0; b < B; ++b) {
          const float* row = lg.data<float>() + (b * (t + 1) + t) * c.vocab_size;
          ref[t].insert(ref[t].end(), row, row + c.vocab_size);
        }
      }
      ZayaDecoder dec(m, B, total);
      Tensor logits = Tensor::empty(Shape{B, c.vocab_size}, DType::f32);
      std::vector<int32_t> prompt;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < T0; ++j) prompt.push_back(seq[b * total + j]);
      dec.prefill(Tensor::borrow(prompt.data(), Shape{B, T0}, DType::i32), logits);
      EXPECT_LE(rel_err(logits.data<float>(), ref[T0 - 1].data(), B * c.vocab_size), 1e-5) << "prefill, shape " << si;
      for (int64_t t = T0; t < total; ++t) {
        std::vector<int32_t> next{seq[t], seq[total + t]};
        dec.step(Tensor::borrow(next.data(), Shape{B}, DType::i32), logits);
        ASSERT_EQ(dec.length(), t + 1);
        EXPECT_LE(rel_err(logits.data<float>(), ref[t].data(), B * c.vocab_size), 1e-5)
            << "shape " << si << " prompt " << T0 << " position " << t;
      }
      EXPECT_THROW(dec.step(Tensor::borrow(prompt.data(), Shape{B}, DType::i32), logits), Error);  // cache full
    }
    ++si;
  }
}

// With the legacy skip passthrough (ModelConfig::skip_passthrough) the decode step passes skipped
// tokens through as the full forward does: every step equals the full forward over the prefix
// (1e-5, as above), with the skip class winning for some tokens and its passthrough moving the
// logits (the same model with the option off gives other logits).
TEST(Decode, SkipPassthroughStepsEqualFullForward) {
  ModelConfig c = make_config(kShapes[0]);
  c.skip_passthrough = true;
  const int64_t B = 2, total = 9, T0 = 2;
  ZayaModel m(c, B, total);
  randomize(m, 300);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) m.balancing_biases().select(l).data<float>()[c.num_experts] += 0.15f;
  std::vector<int32_t> seq(static_cast<size_t>(B * total));
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>((i * 41 + 3) % c.vocab_size);
  Tensor full = Tensor::empty(Shape{B * total, c.vocab_size}, DType::f32);
  m.forward_logits(Tensor::borrow(seq.data(), Shape{B, total}, DType::i32), full);
  int64_t skipped = 0;
  for (const RouterStats& st : m.router_stats()) skipped += st.skipped;
  EXPECT_GT(skipped, 0);
  {
    ModelConfig off = c;
    off.skip_passthrough = false;
    ZayaModel n(off, B, total);
    Tensor(n.params_flat()).copy_from(m.params_flat());
    Tensor(n.balancing_biases()).copy_from(m.balancing_biases());
    Tensor lg = Tensor::empty(Shape{B * total, c.vocab_size}, DType::f32);
    n.forward_logits(Tensor::borrow(seq.data(), Shape{B, total}, DType::i32), lg);
    EXPECT_GT(rel_err(lg.data<float>(), full.data<float>(), B * total * c.vocab_size), 1e-3)
        << "the passthrough must change the logits where the skip class wins";
  }
  // Row t of the full forward is position t's logits (causal: the prefix's own forward gives them).
  auto ref = [&](int64_t t) {
    std::vector<float> r;
    for (int64_t b = 0; b < B; ++b) {
      const float* row = full.data<float>() + (b * total + t) * c.vocab_size;
      r.insert(r.end(), row, row + c.vocab_size);
    }
    return r;
  };
  ZayaDecoder dec(m, B, total);
  Tensor logits = Tensor::empty(Shape{B, c.vocab_size}, DType::f32);
  std::vector<int32_t> prompt;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < T0; ++j) prompt.push_back(seq[b * total + j]);
  dec.prefill(Tensor::borrow(prompt.data(), Shape{B, T0}, DType::i32), logits);
  EXPECT_LE(rel_err(logits.data<float>(), ref(T0 - 1).data(), B * c.vocab_size), 1e-5) << "prefill";
  for (int64_t t = T0; t < total; ++t) {
    std::vector<int32_t> next{seq[t], seq[total + t]};
    dec.step(Tensor::borrow(next.data(), Shape{B}, DType::i32), logits);
    EXPECT_LE(rel_err(logits.data<float>(), ref(t).data(), B * c.vocab_size), 1e-5) << "position " << t;
  }
}

TEST(Decode, RoutingIsExercised) {
  // The decode check above only means something if tokens pick different experts: count distinct
  // choices of layer 0 over a sequence for the first shape.
  ModelConfig c = make_config(kShapes[0]);
  ZayaModel m(c, 1, 11);
  randomize(m, 100);
  std::vector<int32_t> ids(11);
  for (int i = 0; i < 11; ++i) ids[i] = (i * 37 + 5) % static_cast<int>(c.vocab_size);
  m.forward(Tensor::borrow(ids.data(), Shape{1, 11}, DType::i32), Tensor{}, false);
  std::set<int32_t> used;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Tensor ch = m.router_choice(l);
    for (int i = 0; i < 11; ++i) used.insert(ch.data<int32_t>()[i]);
  }
  EXPECT_GE(used.size(), 2u);
}

TEST(Generate, GreedyFollowsTheFullForwardArgmax) {
  ModelConfig c = make_config(kShapes[1]);
  ZayaModel m(c, 1, 4);
  randomize(m, 5);
  std::vector<int32_t> prompt{3, 9, 27, 17};
  GenerateOptions opt;
  opt.max_new = 9;
  auto out = generate(m, Tensor::borrow(prompt.data(), Shape{1, 4}, DType::i32), opt);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].size(), 9u);  // eos −1: never stops early
  std::vector<int32_t> seq = prompt;
  for (int32_t id : out[0]) {
    const int64_t T = static_cast<int64_t>(seq.size());
    m.set_batch_shape(1, T);
    Tensor lg = Tensor::empty(Shape{T, c.vocab_size}, DType::f32);
    m.forward_logits(Tensor::borrow(seq.data(), Shape{1, T}, DType::i32), lg);
    const float* row = lg.data<float>() + (T - 1) * c.vocab_size;
    int32_t best = 0;
    for (int32_t v = 1; v < c.vocab_size; ++v)
      if (row[v] > row[best]) best = v;
    EXPECT_EQ(id, best) << "after " << T << " tokens";
    seq.push_back(id);
  }
}

TEST(Generate, SeededSamplingIsDeterministicAndStopsAtEos) {
  ModelConfig c = make_config(kShapes[0]);
  ZayaModel m(c, 2, 3);
  randomize(m, 9);
  std::vector<int32_t> prompt{4, 8, 15, 16, 23, 42};
  Tensor tp = Tensor::borrow(prompt.data(), Shape{2, 3}, DType::i32);
  GenerateOptions opt;
  opt.max_new = 24;
  opt.sampling = {false, 1.5, 0.95, 1234};
  auto a = generate(m, tp, opt);
  auto b = generate(m, tp, opt);
  EXPECT_EQ(a, b);
  opt.sampling.seed = 1235;
  auto d = generate(m, tp, opt);
  EXPECT_NE(a, d) << "24 draws from a flat (T = 1.5) distribution over 96 ids coincide by chance ~never";
  // eos: pick the id row 0 emits at step 5 as eos; row 0 must stop there, ending with it.
  opt.sampling.seed = 1234;
  opt.eos_token_id = a[0][5];
  auto e = generate(m, tp, opt);
  size_t first = 0;
  while (a[0][first] != opt.eos_token_id) ++first;
  ASSERT_EQ(e[0].size(), first + 1);
  EXPECT_EQ(e[0].back(), opt.eos_token_id);
  // The other row is unaffected up to its own first eos.
  for (size_t i = 0; i < e[1].size(); ++i) EXPECT_EQ(e[1][i], a[1][i]);
}

TEST(Sampling, FrequenciesFollowSoftmaxAndNucleus) {
  // logits ln(0.5), ln(0.3), ln(0.15), ln(0.05): with T = 1 the draws follow these probabilities;
  // with top_p = 0.75 only ids 0 and 1 (0.8 ≥ 0.75) remain, renormalized to 0.625 / 0.375.
  const float lg[4] = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::vector<float> scratch;
  std::vector<int32_t> order;
  const int n = 40000;
  // Tolerance 0.012 absolute on a frequency: binomial std at n = 40000 is ≤ 0.0025, so this is
  // ~5σ (no flaky failures for a fixed seed, and a wrong distribution is off by > 0.05).
  {
    SamplingOptions opt{false, 1.0, 1.0, 77};
    std::vector<int> cnt(4);
    for (int i = 0; i < n; ++i) ++cnt[sample_token(lg, 4, opt, i, scratch, order)];
    const double p[4] = {0.5, 0.3, 0.15, 0.05};
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(cnt[k] / double(n), p[k], 0.012) << k;
  }
  {
    SamplingOptions opt{false, 1.0, 0.75, 78};
    std::vector<int> cnt(4);
    for (int i = 0; i < n; ++i) ++cnt[sample_token(lg, 4, opt, i, scratch, order)];
    EXPECT_EQ(cnt[2] + cnt[3], 0);
    EXPECT_NEAR(cnt[0] / double(n), 0.625, 0.012);
  }
  {
    // T = 0.5 squares the probabilities: 0.25 : 0.09 : 0.0225 : 0.0025 (sum 0.365).
    SamplingOptions opt{false, 0.5, 1.0, 79};
    std::vector<int> cnt(4);
    for (int i = 0; i < n; ++i) ++cnt[sample_token(lg, 4, opt, i, scratch, order)];
    EXPECT_NEAR(cnt[0] / double(n), 0.25 / 0.365, 0.012);
    EXPECT_NEAR(cnt[1] / double(n), 0.09 / 0.365, 0.012);
  }
  {
    // top_k = 2 keeps ids 0 and 1 (0.5 : 0.3, renormalized to 0.625 / 0.375); with top_p = 0.6 the
    // nucleus of those two is id 0 alone (0.625 >= 0.6).
    SamplingOptions opt{false, 1.0, 1.0, 80, 2};
    std::vector<int> cnt(4);
    for (int i = 0; i < n; ++i) ++cnt[sample_token(lg, 4, opt, i, scratch, order)];
    EXPECT_EQ(cnt[2] + cnt[3], 0);
    EXPECT_NEAR(cnt[0] / double(n), 0.625, 0.012);
    opt.top_p = 0.6;
    for (int i = 0; i < 1000; ++i) EXPECT_EQ(sample_token(lg, 4, opt, i, scratch, order), 0);
    opt.top_p = 1.0;
    opt.top_k = 4;  // all of them: the plain softmax again, draw for draw
    SamplingOptions all{false, 1.0, 1.0, 80};
    for (int i = 0; i < 1000; ++i)
      EXPECT_EQ(sample_token(lg, 4, opt, i, scratch, order), sample_token(lg, 4, all, i, scratch, order));
  }
  EXPECT_THROW(sample_token(lg, 4, SamplingOptions{false, 1.0, 1.0, 5, -1}, 0, scratch, order), Error);
  // Greedy, and the lowest id on a tie.
  const float tie[3] = {1.0f, 3.0f, 3.0f};
  EXPECT_EQ(sample_token(tie, 3, SamplingOptions{}, 0, scratch, order), 1);
  // A tiny nucleus keeps only the argmax.
  EXPECT_EQ(sample_token(lg, 4, SamplingOptions{false, 1.0, 1e-6, 5}, 3, scratch, order), 0);
  EXPECT_THROW(sample_token(lg, 4, SamplingOptions{false, 0.0, 1.0, 5}, 0, scratch, order), Error);
  EXPECT_THROW(sample_token(lg, 4, SamplingOptions{false, 1.0, 1.5, 5}, 0, scratch, order), Error);
}

TEST(Decode, UserErrors) {
  ModelConfig c = make_config(kShapes[2]);
  ZayaModel m(c, 1, 4);
  m.init(1);
  ZayaDecoder dec(m, 1, 4);
  Tensor logits = Tensor::empty(Shape{1, c.vocab_size}, DType::f32);
  std::vector<int32_t> ids{1, 2, 3, 4, 5};
  EXPECT_THROW(dec.step(Tensor::borrow(ids.data(), Shape{1}, DType::i32), logits), Error);  // before prefill
  EXPECT_THROW(dec.prefill(Tensor::borrow(ids.data(), Shape{1, 5}, DType::i32), logits), Error);  // > max_len
  Tensor wrong = Tensor::empty(Shape{1, c.vocab_size + 1}, DType::f32);
  EXPECT_THROW(dec.prefill(Tensor::borrow(ids.data(), Shape{1, 2}, DType::i32), wrong), Error);
}

}  // namespace
}  // namespace zaya::model

namespace zaya::model {
namespace {

// generate() and the decoder refuse positions past max_position_embeddings before sizing their
// caches (max_new = 10^9 used to allocate caches for a billion positions), and an eos id outside
// the vocabulary (one that can never be emitted) other than −1 (never stop).
TEST(Generate, BoundsPositionsByMaxPositionEmbeddingsAndEosByTheVocabulary) {
  ModelConfig c = make_config(kShapes[2]);  // max_position_embeddings = 128
  ZayaModel m(c, 1, 4);
  m.init(1);
  std::vector<int32_t> ids{1, 2, 3, 4};
  const Tensor prompt = Tensor::borrow(ids.data(), Shape{1, 4}, DType::i32);
  GenerateOptions opt;
  opt.max_new = 1000000000;
  std::string e = zaya::test::error_of([&] { generate(m, prompt, opt); });
  EXPECT_NE(e.find("generate: the prompt's 4 tokens + max_new 1000000000 exceed the model's max_position_embeddings "
                   "(128)"),
            std::string::npos)
      << e;
  opt.max_new = INT64_MAX;  // no overflow in prompt + max_new
  EXPECT_NE(zaya::test::error_of([&] { generate(m, prompt, opt); }), "");
  EXPECT_NE(zaya::test::error_of([&] { ZayaDecoder(m, 1, 129); }).find("exceeds the model's max_position_embeddings"),
            std::string::npos);
  opt.max_new = 124;  // exactly fills the positions
  opt.eos_token_id = -1;
  EXPECT_EQ(generate(m, prompt, opt)[0].size(), 124u);
  opt.max_new = 2;
  for (int64_t eos : {int64_t{-3}, c.vocab_size}) {
    opt.eos_token_id = eos;
    e = zaya::test::error_of([&] { generate(m, prompt, opt); });
    EXPECT_NE(e.find("generate: eos_token_id must be a token id in [0, "), std::string::npos) << eos << ": " << e;
  }
}

}  // namespace
}  // namespace zaya::model
