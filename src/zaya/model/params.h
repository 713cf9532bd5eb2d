// The parameter inventory of a ZAYA1 model: every tensor's Hugging Face name, shape, role and
// initialization, computed from the config alone (no allocation). The model's flat buffers, the
// optimizer's Muon/AdamW split, checkpoints and `zaya size` all read this one list.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/model/config.h"

namespace zaya::model {

enum class ParamRole {
  embedding,      // model.embed_tokens.weight (tied LM head)
  matrix,         // 2-D hidden projections: q/k/v/o, router down_proj and MLP
  expert_matrix,  // [E, rows, cols] stacks: each expert's matrix is its own 2-D matrix
  norm_weight,    // RMSNorm weights (init 1)
  scale,          // residual / input / EDA scales (init 1)
  bias,           // biases (init 0)
  conv_weight,    // CCA conv kernels
  temperature,    // qk_norm.temp
};

enum class InitKind { normal, ones, zeros, constant };

struct ParamSpec {
  std::string name;  // Hugging Face name
  Shape shape;
  ParamRole role;
  InitKind init;
  float init_value = 0;  // std for normal, the value for constant
  int layer = -1;        // -1 for global tensors
  bool is_expert() const { return role == ParamRole::expert_matrix; }
  // The weights GEMMs read (the embedding as the tied head's): the rest feed f32 element-wise ops.
  bool is_gemm_weight() const {
    return role == ParamRole::matrix || role == ParamRole::expert_matrix || role == ParamRole::embedding;
  }
};

// Every trainable parameter, in a fixed order (embedding, input scale/bias, then layer by layer,
// final norm). The balancing biases are not parameters (no loss gradient): see balancing_bias_name.
std::vector<ParamSpec> parameter_specs(const ModelConfig& c);
std::string balancing_bias_name(int layer);
// The flat gradient ranges ZayaModel::backward reports as final, in its order (the final norm, the
// layers last to first, then everything before layer 0), for parameters laid out contiguously in
// `specs` order: what data-parallel gradient buckets are planned from, with or without a model.
std::vector<std::pair<int64_t, int64_t>> gradient_report_order(const std::vector<ParamSpec>& specs);  // model.layers.{l}.mlp.gate.balancing_biases, [E+1] fp32
// Every tensor of a model checkpoint, in order: the parameters (parameter_specs), then each
// layer's balancing biases [E+1].
std::vector<std::pair<std::string, Shape>> weight_shapes(const ModelConfig& c);

struct ParamCounts {
  int64_t total = 0;          // all trainable parameters (tied head counted once)
  int64_t embedding = 0;      // the embedding matrix
  int64_t non_embedding = 0;  // total - embedding
  int64_t active = 0;         // non-embedding parameters one token touches (one expert per layer)
  int64_t expert = 0;         // all expert matrices
};
ParamCounts count_parameters(const ModelConfig& c);

// Training FLOPs per token: 6 * (active non-embedding + LM head) + attention 6 * L * T * (nq*hd)
// (the llm.c / torchtitan convention, REFERENCES.md "Hardware peaks").
double training_flops_per_token(const ModelConfig& c, int64_t seq_len);
// Activation bytes one token keeps alive per layer for backward (what ZayaModel saves), with
// `bytes_per_element` for activations in the compute dtype and 4 bytes for the fp32 residual stream
// and softmax statistics. docs/model.md derives it; the trainer prints it at start.
int64_t activation_bytes_per_token_per_layer(const ModelConfig& c, int64_t bytes_per_element);
// Decode KV cache bytes per token (post-RoPE K and V, nkv*hd each, per layer).
int64_t kv_cache_bytes_per_token(const ModelConfig& c, int64_t bytes_per_element);

}  // namespace zaya::model
