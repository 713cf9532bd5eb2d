// ModelConfig: the shape of a ZAYA1 model, read from a TOML run config ([model] section, keys named
// as in transformers' ZayaConfig) or from a transformers config.json, validated with errors that
// name the file and the key.
#pragma once

#include <cstdint>
#include <string>

namespace zaya {
class ConfigReader;
}

namespace zaya::model {

struct ModelConfig {
  int64_t vocab_size = 8192;
  int64_t hidden_size = 256;            // H
  int64_t num_hidden_layers = 4;        // L
  int64_t num_attention_heads = 4;      // nq
  int64_t num_key_value_heads = 2;      // nkv
  int64_t head_dim = 64;                // hd
  int64_t num_experts = 8;              // E real experts; the router has E + 1 classes (last = skip)
  int64_t moe_intermediate_size = 512;  // I
  int64_t router_hidden_size = 64;      // R
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.5;
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.02;
  // Initial key temperature τ. transformers initializes 0 (uniform attention at init, which starts
  // training with no positional signal in the logits); we default to 1 so q·k carries information
  // from step one. docs/model.md explains the choice.
  double key_temperature_init = 1.0;
  int64_t pad_token_id = 0;
  int64_t bos_token_id = 2;
  int64_t eos_token_id = 1;
  // What the MoE block outputs for a token whose router chose the skip class (index E). false (the
  // native behaviour of transformers' ZayaForCausalLM): 0. true (the legacy layout of Zyphra's
  // transformers fork, in which ZAYA1-base was released): p_skip times the token's MoE input, the
  // post-attention RMSNorm's output ("mixture of depths"). The legacy import turns it on; TOML
  // `model.skip_passthrough`, config.json `skip_passthrough` (written only when true).
  bool skip_passthrough = false;

  // Derived sizes.
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t conv_channels() const { return q_dim() + kv_dim(); }  // C
  int64_t group_size() const { return num_attention_heads / num_key_value_heads; }  // G
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
  int64_t router_classes() const { return num_experts + 1; }

  // Throws zaya::Error naming `source` and the offending key.
  void validate(const std::string& source) const;

  // Reads the [model] section (keys optional; defaults above), then validates.
  static ModelConfig from_toml(ConfigReader& reader);
  // Reads a transformers config.json (model_type "zaya"), then validates.
  static ModelConfig from_hf_json(const std::string& path);
  static ModelConfig from_hf_json_text(const std::string& text, const std::string& source);
  // A config.json that transformers' AutoConfig loads as ZayaConfig.
  std::string to_hf_json() const;
  // The config.json keys whose values differ from `other`'s, as "key: this vs other" joined by
  // "; " (empty when the two write the same config.json).
  std::string differences(const ModelConfig& other) const;
};

}  // namespace zaya::model
