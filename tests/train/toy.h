// Shared by the trainer tests: a tiny synthetic corpus and a tiny model's run config, so each
// training run takes well under a second.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/data/indexed_dataset.h"

namespace zaya::train::toy {

// A corpus with structure to learn: 40 documents of 30 runs of 6 consecutive ids from
// [first, first + 55), EOS-terminated (7240 tokens). `seed` and `first` give distinct datasets.
inline std::string make_corpus(const std::filesystem::path& dir, const std::string& name = "toy",
                               unsigned seed = 7, int first = 4) {
  std::filesystem::create_directories(dir);
  std::string prefix = (dir / name).string();
  data::IndexedDatasetWriter w(prefix + ".bin", prefix + ".idx", data::TokenDtype::u16);
  std::mt19937 rng(seed);
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> doc;
    for (int s = 0; s < 30; ++s) {
      int start = first + static_cast<int>(rng() % 50);
      for (int k = 0; k < 6; ++k) doc.push_back(start + k);
    }
    doc.push_back(1);  // eos
    w.add_document(doc);
  }
  w.finalize();
  return prefix;
}

// [model] of a 2-layer, 3-expert model with a 64-token vocabulary and 64 positions.
inline std::string model_section() {
  return "[model]\nvocab_size = 64\nhidden_size = 32\nnum_hidden_layers = 2\nnum_attention_heads = 2\n"
         "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 3\nmoe_intermediate_size = 32\n"
         "router_hidden_size = 32\nmax_position_embeddings = 64\n";
}

inline std::string toy_config(const std::string& prefix, const std::filesystem::path& out, int steps) {
  return model_section() + "[data]\ntrain = [\"" + prefix + "\"]\nval = \"" + prefix +
         "\"\n"
         "[train]\nsteps = " +
         std::to_string(steps) +
         "\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\n"
         "eval_every = 0\neval_samples = 4\nprogress = false\nout_dir = \"" +
         out.string() +
         "\"\n"
         "[optim]\nlr = 3e-3\nwarmup_steps = 5\nbalance_lr = 1e-3\n"
         "[ckpt]\nevery = 5\nkeep_last = 10\n";
}

inline std::vector<float> flat(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

}  // namespace zaya::train::toy
