// Import of ZAYA1's legacy checkpoint layout (Zyphra's transformers fork; the layout of the
// released ZAYA1-base): 2L half-layers `model.layers.{n}` (even n = attention, odd n = MoE), names
// such as `self_attn.qkv.linear_q`, `zaya_block.router.router_mlp.0`,
// `zaya_block.experts.local_experts.{e}.linear_fc1`, one `res_scale` per half-layer applied at its
// START (to the previous half-layer's output and the residual) plus a final `model.res_scale`, and
// `model.final_norm`. The weights are renamed, the per-expert matrices stacked, and the residual
// scales moved to the native positions; the mapping is exact (docs/legacy-import.md derives it).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "zaya/model/zaya_model.h"

namespace zaya::ckpt {

// True when `dir`/config.json is a legacy-layout ZAYA1 config (model::is_legacy_hf_config).
bool is_legacy_hf_dir(const std::filesystem::path& dir);

// The layers of `m` in which the skip class can win the biased choice argmax_e (p_e + β_e) for
// some probability vector: β_skip + 1 > max over the real experts of β_e. Where it cannot, the
// skip passthrough (ModelConfig::skip_passthrough) never acts and the legacy and native MoE agree.
std::vector<int64_t> skip_class_winning_layers(const model::ZayaModel& m);
// "0, 3, 5".
std::string layer_list(const std::vector<int64_t>& layers);

// The legacy tensor that holds the native parameter `native_name` of a model with `layers` native
// layers; for the stacked expert matrices (`...mlp.experts.gate_up_proj`, `...down_proj`) the
// tensor of expert `expert`. Balancing biases (`model::balancing_bias_name`) map too.
std::string legacy_tensor_name(const std::string& native_name, int64_t layers, int64_t expert = -1);

// Copies every parameter and balancing-bias vector of `m` from the legacy-layout safetensors of
// `dir` (F32 or BF16, one file or an index's shards). Strict: a tensor left over (a name the
// mapping does not produce, e.g. layer 0's residual_scale, which the legacy model never creates),
// a missing or mis-shaped one is a zaya::Error naming it and the file. Logs a warning naming the
// layers whose balancing biases let the skip class win only when `m` has skip_passthrough off (the
// legacy config turns it on; docs/legacy-import.md, "The skip class").
void load_legacy_hf_weights(const std::filesystem::path& dir, const std::vector<std::filesystem::path>& files,
                            model::ZayaModel& m);

}  // namespace zaya::ckpt
