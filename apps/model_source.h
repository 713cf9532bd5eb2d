// The model a command runs, from its flags: a zaya checkpoint or transformers directory (--model),
// or zaya's own init of a TOML config (--init-config + --seed). Shared by `zaya forward` and
// `zaya bench step`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zaya/model/zaya_model.h"
#include "zaya/optim/config.h"
#include "zaya/train/model_io.h"

namespace zaya::app {

struct ModelSource {
  std::string model, init_config;
  uint64_t seed = 0;
  std::string gemm_dtype = "f32";  // f32 or bf16 inputs for the weight GEMMs (experts, projections, LM head)
  std::string device = "cpu";      // cpu or cuda
  std::vector<std::string> overrides;  // --set KEY=VALUE on --init-config's keys
};

// --device: where a command runs its model ("cpu" or "cuda"). A GPU that is not there is an error
// naming the flag.
Device parse_device_flag(const std::string& device);

// A model for batches of [batch, seq] tokens; `command` names the caller in errors. seq must fit
// the model's max_position_embeddings (checked before the activations are allocated). `optim`,
// when given, also gets the [optim] section of --init-config (its defaults with --model). Every
// --set key must be one that was read: a mistyped override is an error, not a silent default.
std::unique_ptr<model::ZayaModel> make_model(const ModelSource& source, int64_t batch, int64_t seq,
                                             const std::string& command, optim::OptimizerConfig* optim = nullptr);
// A model from `path` (zaya checkpoint or transformers directory) for [batch, seq] tokens, with
// seq checked against its max_position_embeddings before the activations for [batch, seq] are
// allocated; `what` names the source of seq in the error ("--ids", "--seq").
train::LoadedModel load_model_checked(const std::string& path, int64_t batch, int64_t seq, const std::string& what,
                                      Device device = Device::cpu);
// Throws unless `positions` tokens fit the model's max_position_embeddings: RoPE positions past it
// are ones the model never trained on, so its output there is not to be trusted.
void check_positions(const model::ModelConfig& c, int64_t positions, const std::string& what);
// The SentencePiece model that goes with a model source, or "" when it names none. A transformers
// directory: its tokenizer.model. A zaya checkpoint: the `tokenizer` its state records, which is
// as training was given it, often relative to the directory training ran in; a relative path is
// tried from the current directory, then the checkpoint's run directory, then the directory
// training ran in (the run directory less the config's relative train.out_dir), so the checkpoint
// works from anywhere. Recorded but found nowhere: a zaya::Error listing the places tried, which
// tells the user to pass --tokenizer.
std::string source_tokenizer(const std::string& source);
// Applies source.gemm_dtype (an error names anything but f32 and bf16).
void apply_gemm_dtype(const ModelSource& source, model::ZayaModel& m);

}  // namespace zaya::app
