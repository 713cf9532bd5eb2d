// Model weights in and out of zaya checkpoints, shared by the trainer and the ckpt/eval/generate
// commands. A "model source" is a zaya checkpoint (a step directory, or a run directory whose
// `latest` names one) or a transformers save_pretrained directory (config.json + safetensors).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/writer.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/param_table.h"

namespace zaya::train {

// The parameters and balancing biases of `m`, named as in Hugging Face, ready to save.
std::vector<ckpt::SaveItem> weight_items(const model::ZayaModel& m);
// One data-parallel rank's share of them: the rows of each parameter inside `range` of the flat
// buffer (whole rows of the leading dimension, as the ZeRO-1 shard plan cuts), and the balancing
// biases (the same on every rank) only `with_replicated`. `values`, when defined: f32 [end − begin],
// the values of the range to save instead of the model's (the fp32 master weights of a run with
// bf16 weights, train/master_weights.h).
std::vector<ckpt::SaveItem> weight_items(const model::ZayaModel& m, optim::ShardRange range, bool with_replicated,
                                         const Tensor& values = {});
// Copies parameters and balancing biases from a checkpoint into `m` (same config).
void load_weights(const ckpt::Checkpoint& c, model::ZayaModel& m);
// The model config stored in a checkpoint's state ("model_config", transformers schema).
model::ModelConfig checkpoint_model_config(const ckpt::Checkpoint& c);

struct LoadedModel {
  std::unique_ptr<model::ZayaModel> model;
  nlohmann::json state;          // the checkpoint's state (empty for a transformers directory)
  std::filesystem::path source;  // the resolved directory
  bool from_hf = false;
};
// Loads a model for batches of [batch, seq_len] from a zaya checkpoint or a transformers directory,
// onto `device` (read on the host, then copied over).
LoadedModel load_model_source(const std::string& path, int64_t batch, int64_t seq_len, Device device = Device::cpu);
// The same model on `device` for batches of [batch, seq_len]: its weights and balancing biases
// copied (m itself when it is already there with that shape).
std::unique_ptr<model::ZayaModel> model_on(std::unique_ptr<model::ZayaModel> m, Device device, int64_t batch,
                                           int64_t seq_len);

// The state object of a zaya checkpoint (manifest only, no tensor is read); an empty object for a
// transformers directory. For looking up the tokenizer or sequence length before loading a model.
nlohmann::json source_state(const std::string& path);

// Writes a weights-only zaya checkpoint (step 0, no optimizer state): `zaya ckpt import-hf`'s
// output and a start point for training (train.init_from).
std::filesystem::path save_weights_checkpoint(const model::ZayaModel& m, const std::filesystem::path& run_dir,
                                              const nlohmann::json& extra_state = {});

}  // namespace zaya::train
