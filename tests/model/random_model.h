// Small random ZAYA1 models for the model tests: a config from its dimensions, and weights moved
// off their init values so that attention, the conv taps, the value shift and the routing all
// depend on the input (shared by the decode, recompute and device tests).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "zaya/core/random.h"
#include "zaya/model/config.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"

namespace zaya::test {

using model::InitKind;
using model::ModelConfig;
using model::ParamSpec;
using model::ZayaModel;

struct ModelDims {
  int64_t nq, nkv, hd, E, L, R, I, H, V;
};

inline ModelConfig small_config(const ModelDims& d, int64_t max_positions, double rope_theta = ModelConfig{}.rope_theta) {
  ModelConfig c;
  c.num_attention_heads = d.nq;
  c.num_key_value_heads = d.nkv;
  c.head_dim = d.hd;
  c.num_experts = d.E;
  c.num_hidden_layers = static_cast<int>(d.L);
  c.router_hidden_size = d.R;
  c.moe_intermediate_size = d.I;
  c.hidden_size = d.H;
  c.vocab_size = d.V;
  c.rope_theta = rope_theta;
  c.max_position_embeddings = max_positions;
  return c;
}

// Init, then matrices with std router_gain/√fan_in for the router MLP's and 1/√fan_in for the
// rest, zero-init vectors ~N(0, 0.1), the others uniform in [0.6, 1.4], and balancing biases
// ~N(0, 0.05). A router gain above 1 spreads the router's logits so that routing depends on the input.
inline void randomize(ZayaModel& m, uint64_t seed, float router_gain = 1.0f) {
  m.init(seed);
  for (size_t i = 0; i < m.specs().size(); ++i) {
    Tensor t = m.param(static_cast<int>(i));
    const ParamSpec& s = m.specs()[i];
    const uint64_t k = seed * 7919 + i;
    if (s.shape.ndim() >= 2) {
      const float gain = s.name.find("router_mlp") != std::string::npos ? router_gain : 1.0f;
      fill_normal(t, k, 0, 0.0f, gain / std::sqrt(static_cast<float>(s.shape[s.shape.ndim() - 1])));
    } else if (s.init == InitKind::zeros) {
      fill_normal(t, k, 0, 0.0f, 0.1f);
    } else {
      fill_uniform(t, k, 0, 0.6f, 1.4f);
    }
  }
  Tensor beta = m.balancing_biases();
  fill_normal(beta, seed + 7, 0, 0.0f, 0.05f);
}

}  // namespace zaya::test
