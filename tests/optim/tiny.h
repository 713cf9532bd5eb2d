// Shared fixtures for the optimizer tests: a tiny ZAYA1 config and a fixed random batch.
#pragma once

#include <cstdint>
#include <vector>

#include "zaya/core/random.h"
#include "zaya/core/tensor.h"
#include "zaya/model/config.h"

namespace zaya::optim::test {

// Small enough that 30 training steps take well under a second per run on 2 cores.
inline model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.num_experts = 4;
  c.moe_intermediate_size = 32;
  c.router_hidden_size = 16;
  c.max_position_embeddings = 64;
  return c;
}

struct Batch {
  std::vector<int32_t> ids, targets;
  Tensor tid, ttg;
};

// Uniform random tokens in [1, V), targets = next token (last position ignored).
inline Batch make_batch(int64_t vocab, int64_t B, int64_t T, uint64_t seed) {
  Batch b;
  Tensor u = Tensor::empty(Shape{B * T}, DType::f32);
  fill_uniform(u, seed, 0);
  for (int64_t i = 0; i < B * T; ++i)
    b.ids.push_back(1 +
                    static_cast<int32_t>(u.data<float>()[i] * static_cast<float>(vocab - 1)) % (vocab - 1));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) b.targets.push_back(t + 1 < T ? b.ids[r * T + t + 1] : -100);
  b.tid = Tensor::borrow(b.ids.data(), Shape{B, T}, DType::i32);
  b.ttg = Tensor::borrow(b.targets.data(), Shape{B, T}, DType::i32);
  return b;
}

}  // namespace zaya::optim::test
