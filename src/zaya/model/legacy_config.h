// The config.json of ZAYA1's legacy checkpoint layout (Zyphra's transformers fork, the layout of
// the released ZAYA1-base): 2L alternating half-layers (even = CCA attention, odd = MoE) described
// by `zaya_layers` and per-half-layer lists (`cca_num_q_heads`, `num_query_groups_list`,
// `ffn_hidden_size_list`, `zaya_mlp_expansion`), Megatron-style key names (`norm_epsilon`,
// `kv_channels`, `moe_router_topk`, ...). It is read into the native ModelConfig (L layers of
// attention + MoE); docs/legacy-import.md lists every key, how it maps, and what is refused.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "zaya/model/config.h"

namespace zaya::model {

// True when a parsed config.json (model_type "zaya") is in the legacy layout: it has one of the
// keys only the fork's ZayaConfig writes (zaya_layers, cca, cca_num_q_heads, num_query_groups,
// num_query_groups_list, ffn_hidden_size, ffn_hidden_size_list, zaya_mlp_expansion, kv_channels,
// norm_epsilon, moe_router_topk) and none of the native layout's (moe_intermediate_size,
// router_hidden_size, layer_types).
bool is_legacy_hf_config(const nlohmann::json& j);

// The native ModelConfig of a legacy config.json. Throws zaya::Error naming `source` and the key
// for anything the native model cannot represent: a sliding-window layer, experts-per-token other
// than 1, per-half-layer lists that disagree between layers or with the attention/MoE alternation,
// disabled residual scaling, EDA or skip class, biases on linear layers, untied embeddings, ...
// The result has skip_passthrough on: the legacy MoE's skip class (ModelConfig::skip_passthrough).
ModelConfig legacy_hf_config(const nlohmann::json& j, const std::string& source);

}  // namespace zaya::model
