// Hugging Face interop for ZAYA1: load a transformers save_pretrained directory (config.json +
// model.safetensors or a sharded model.safetensors.index.json) into a ZayaModel, and export a
// ZayaModel as one that transformers' ZayaForCausalLM loads. Names are the HF names (no renaming).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/model/config.h"
#include "zaya/model/zaya_model.h"

namespace zaya::ckpt {

// config.json of a transformers directory, native or legacy ZAYA1 layout (model/legacy_config.h).
model::ModelConfig read_hf_config(const std::filesystem::path& dir);

// The safetensors files of a transformers directory: model.safetensors, or the shards that
// model.safetensors.index.json names.
std::vector<std::filesystem::path> hf_weight_files(const std::filesystem::path& dir);

class SafetensorsFile;
struct StTensorInfo;
// Converts one stored tensor (F32 or BF16) into the contiguous f32 `dst` after checking its shape
// and that every value is finite; errors name the tensor and the file.
void copy_hf_tensor(const SafetensorsFile& f, const StTensorInfo& info, const Tensor& dst);

// Copies every parameter and the balancing biases from the directory's safetensors (F32 or BF16,
// converted to f32). Strict: a missing, unexpected or mis-shaped tensor is a zaya::Error naming the
// tensor and the file. lm_head.weight, if present, must equal the embedding (the head is tied).
// A directory whose config.json is in ZAYA1's legacy layout is read by load_legacy_hf_weights
// (hf_legacy.h): names mapped, experts stacked, residual scales moved.
void load_hf_weights(const std::filesystem::path& dir, model::ZayaModel& m);

// read_hf_config + a ZayaModel for [batch, seq_len] + load_hf_weights.
std::unique_ptr<model::ZayaModel> load_hf_model(const std::filesystem::path& dir, int64_t batch, int64_t seq_len);

// Writes config.json, generation_config.json (bos/eos/pad ids) and model.safetensors (f32 or bf16);
// when the tensors exceed `shard_bytes`,
// model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json instead.
void export_hf(const model::ZayaModel& m, const std::filesystem::path& dir, DType dtype = DType::f32,
               uint64_t shard_bytes = 5'000'000'000ull);

}  // namespace zaya::ckpt
