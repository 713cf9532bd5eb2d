#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "zaya/core/error.h"
#include "zaya/model/generate.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/sizing/decode_roofline.h"

namespace zaya::sizing {
namespace {

// A random valid small config: the counts below must hold for any shape, not one hand-picked one.
model::ModelConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  model::ModelConfig c;
  c.num_key_value_heads = pick(1, 3);
  c.num_attention_heads = c.num_key_value_heads * pick(1, 3);
  c.head_dim = 4 * pick(1, 4);  // even, with an even number of rotary dims (half of them)
  c.hidden_size = pick(8, 48);
  c.num_hidden_layers = pick(1, 3);
  c.num_experts = pick(1, 6);
  c.moe_intermediate_size = pick(4, 40);
  c.router_hidden_size = pick(4, 24);
  c.vocab_size = pick(16, 200);
  c.max_position_embeddings = 64;
  c.validate("random test config");
  return c;
}

double expert_numel(const model::ZayaModel& m) {
  double n = 0;
  for (size_t i = 0; i < m.specs().size(); ++i)
    if (m.specs()[i].is_expert()) n += static_cast<double>(m.param(static_cast<int>(i)).numel());
  return n;
}

TEST(DecodeRoofline, WeightBytesAreTheModelsParametersForAnyConfig) {
  std::mt19937_64 rng(42);
  ServeOptions o;
  o.weight_bytes = 4;  // the model's parameters are f32
  for (int trial = 0; trial < 12; ++trial) {
    const model::ModelConfig c = random_config(rng);
    model::ZayaModel m(c, 1, 1);
    const double params = static_cast<double>(m.params_flat().numel());
    const double biases = static_cast<double>(m.balancing_biases().numel());
    const double experts = expert_numel(m);
    const double E = static_cast<double>(c.num_experts);
    // Every expert hit: every tensor the model holds for inference is read once.
    EXPECT_DOUBLE_EQ(decode_weight_bytes(c, E, o).total(), 4.0 * (params + biases)) << "trial " << trial;
    // One expert hit: the others' share of the expert stacks is not read.
    EXPECT_NEAR(decode_weight_bytes(c, 1.0, o).total(), 4.0 * (params + biases - experts * (E - 1) / E),
                1e-9 * params)  // experts / E is an exact integer in the model, a double quotient here
        << "trial " << trial;
    EXPECT_DOUBLE_EQ(decode_weight_bytes(c, E, o).lm_head, 4.0 * static_cast<double>(m.param(0).numel()));
  }
}

TEST(DecodeRoofline, FlopsAreTwicePerTouchedParameterPlusAttention) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    const model::ModelConfig c = random_config(rng);
    model::ZayaModel m(c, 1, 1);
    const double params = static_cast<double>(m.params_flat().numel());
    const double per_expert_layer_sum = expert_numel(m) / static_cast<double>(c.num_experts);
    const double non_expert = params - expert_numel(m);  // the tied embedding (the LM head) included, once
    for (int64_t B : {1, 3, 17}) {
      for (int64_t ctx : {1, 9}) {
        const DecodeStep s = decode_step(c, B, ctx, nullptr, ServeOptions{});
        // Attention per sequence and layer: each query head takes ctx dot products of hd (scores)
        // and ctx·hd multiply-adds over the values.
        const double attention = static_cast<double>(B * c.num_hidden_layers * c.num_attention_heads) *
                                 (2.0 * ctx * c.head_dim + 2.0 * ctx * c.head_dim);
        const double want = 2.0 * B * (non_expert + per_expert_layer_sum) + attention;
        EXPECT_NEAR(s.flops, want, 1e-12 * want) << "trial " << trial << " B " << B << " ctx " << ctx;
        EXPECT_EQ(s.step_s, 0);  // no profile: counts only
      }
    }
  }
}

TEST(DecodeRoofline, CacheBytesAreTheDecodersCacheTensors) {
  std::mt19937_64 rng(3);
  ServeOptions o;
  o.cache_bytes = 4;  // the decoder's caches are f32
  for (int trial = 0; trial < 8; ++trial) {
    const model::ModelConfig c = random_config(rng);
    model::ZayaModel m(c, 1, 1);
    for (int64_t B : {1, 3}) {
      const int64_t ctx = 5 + trial;
      model::ZayaDecoder dec(m, B, ctx);
      double kv = 0, state = 0;
      for (int l = 0; l < c.num_hidden_layers; ++l) {
        const auto& lc = dec.cache(l);
        kv += static_cast<double>(lc.k.nbytes() + lc.v.nbytes());
        state += static_cast<double>(lc.conv.nbytes() + lc.vd_prev.nbytes());
      }
      const CacheBytes cb = cache_bytes_per_sequence(c, ctx, o);
      EXPECT_DOUBLE_EQ(static_cast<double>(B) * cb.kv, kv) << "trial " << trial;
      EXPECT_DOUBLE_EQ(static_cast<double>(B) * cb.cca_state, state) << "trial " << trial;
      const DecodeStep s = decode_step(c, B, ctx, nullptr, o);
      EXPECT_DOUBLE_EQ(s.kv_bytes, kv);
      EXPECT_DOUBLE_EQ(s.state_bytes, 2.0 * state);  // read and written back
    }
  }
}

TEST(DecodeRoofline, ExpectedDistinctExpertsMatchesASimulation) {
  std::mt19937_64 rng(11);
  const int trials = 5000;
  for (int64_t E : {1, 4, 16, 64}) {
    for (int64_t k : {1, 2}) {
      if (k > E) continue;
      for (int64_t n : {1, 8, 64, 256}) {
        double sum = 0, sum2 = 0;
        std::vector<int64_t> ids(static_cast<size_t>(E));
        for (int t = 0; t < trials; ++t) {
          std::set<int64_t> hit;
          for (int64_t tok = 0; tok < n; ++tok) {
            // k distinct experts per token: a partial Fisher-Yates shuffle.
            for (int64_t e = 0; e < E; ++e) ids[static_cast<size_t>(e)] = e;
            for (int64_t j = 0; j < k; ++j) {
              const int64_t r = std::uniform_int_distribution<int64_t>(j, E - 1)(rng);
              std::swap(ids[static_cast<size_t>(j)], ids[static_cast<size_t>(r)]);
              hit.insert(ids[static_cast<size_t>(j)]);
            }
          }
          const double h = static_cast<double>(hit.size());
          sum += h;
          sum2 += h * h;
        }
        const double mean = sum / trials, var = std::max(0.0, sum2 / trials - mean * mean);
        // 5 standard errors of the simulated mean, plus the mean's resolution 1/trials: where
        // missing an expert is rarer than once in `trials` (E 16, n 256: p ≈ 1e-6) the simulated
        // count never varies and the formula's deficit is below one count in all the trials.
        const double tol = 5.0 * std::sqrt(var / trials) + 1.0 / trials;
        EXPECT_NEAR(expected_distinct_experts(E, static_cast<double>(n), k), mean, tol)
            << "E " << E << " k " << k << " n " << n;
      }
    }
  }
  EXPECT_THROW(expected_distinct_experts(4, 1, 5), Error);
}

TEST(DecodeRoofline, Zaya1BaseCachesEightTimesLessThanMhaAndDecodesMemoryBound) {
  model::ModelConfig c;
  c.vocab_size = 262272, c.hidden_size = 2048, c.num_hidden_layers = 40, c.num_attention_heads = 8;
  c.num_key_value_heads = 2, c.head_dim = 128, c.num_experts = 16, c.moe_intermediate_size = 2048;
  c.router_hidden_size = 256, c.max_position_embeddings = 131072;
  const ServeOptions o;
  const CacheBytes cb = cache_bytes_per_sequence(c, 4096, o);
  EXPECT_DOUBLE_EQ(cb.ratio_vs_mha(), 8.0);  // H 2048 / (nkv·hd 256)
  EXPECT_DOUBLE_EQ(cb.kv, 4096.0 * static_cast<double>(model::kv_cache_bytes_per_token(c, 2)));
  const HardwareProfile hw = builtin_profile("h100");
  const DecodeStep b1 = decode_step(c, 1, 4096, &hw, o), b64 = decode_step(c, 64, 4096, &hw, o);
  EXPECT_TRUE(b1.memory_bound());
  EXPECT_DOUBLE_EQ(b1.step_s, std::max(b1.memory_s, b1.compute_s));
  EXPECT_DOUBLE_EQ(b1.memory_s, b1.bytes() / hw.memory_bandwidth);
  // Batch 64 hits nearly all 16 experts (16·(1 − (15/16)^64) = 15.74): more bytes per step, but
  // more tokens per second, though at 4096 positions the 64 K/V caches (10.7 GB) outweigh the
  // weights, so far less than 64 times more.
  EXPECT_NEAR(b64.distinct_experts, 16.0 * (1.0 - std::pow(15.0 / 16.0, 64)), 1e-12);
  EXPECT_GT(b64.bytes(), b1.bytes());
  EXPECT_GT(b64.tokens_per_s(), 4 * b1.tokens_per_s());
  EXPECT_LT(b64.tokens_per_s(), 64 * b1.tokens_per_s());
  const Prefill p = prefill_cost(c, 4096, &hw, o);
  EXPECT_FALSE(p.memory_s >= p.compute_s);  // a long prompt is compute-bound
  EXPECT_THROW(decode_step(c, 0, 4096, &hw, o), Error);
}

TEST(DecodeRoofline, AnExactShapeInTheTableWinsOverTheSizeInterpolation) {
  HardwareProfile p = builtin_profile("h100");
  // A one-row GEMM and a 32-row GEMM of the same size: what the decode of one sequence runs, and
  // what the size-only interpolation would price it as.
  p.gemm_table = {{1, 32768, 1024, 2e9}, {32, 1024, 1024, 7e10}, {32, 1024, 1024, 5e10}, {1024, 1024, 1024, 3e10}};
  EXPECT_EQ(gemm_rate_at_shape(p, 1, 32768, 1024), 2e9);
  EXPECT_EQ(gemm_rate_at_shape(p, 32, 1024, 1024), 6e10);  // the mean of the two measurements
  EXPECT_EQ(gemm_rate_at_shape(p, 8, 4096, 1024), gemm_rate(p, 8, 4096, 1024));  // no exact entry
  EXPECT_NE(gemm_rate(p, 1, 32768, 1024), 2e9);  // the size-keyed mean mixes both shapes
}

}  // namespace
}  // namespace zaya::sizing
