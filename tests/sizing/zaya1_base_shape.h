// ZAYA1-base's shape for the sizing tests (hidden 2048, CCA 8/2 heads of 128, 16 experts of 2048,
// router 256, vocabulary 262,272, 4,096 positions), with the layer count a test needs.
#pragma once

#include "zaya/model/config.h"

namespace zaya::test {

inline model::ModelConfig zaya1_base_shape(int layers) {
  model::ModelConfig c;
  c.hidden_size = 2048;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 128;
  c.num_experts = 16;
  c.moe_intermediate_size = 2048;
  c.router_hidden_size = 256;
  c.vocab_size = 262272;
  c.max_position_embeddings = 4096;
  return c;
}

}  // namespace zaya::test
