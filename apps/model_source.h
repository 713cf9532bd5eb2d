// The model a command runs, from its flags: a zaya checkpoint or transformers directory (--model),
// or zaya's own init of a TOML config (--init-config + --seed). Shared by `zaya forward` and
// `zaya bench step`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zaya/model/zaya_model.h"

namespace zaya::app {

struct ModelSource {
  std::string model, init_config;
  uint64_t seed = 0;
  std::string gemm_dtype = "f32";  // f32 or bf16 inputs for the expert and LM-head GEMMs
};

// A model for batches of [batch, seq] tokens; `command` names the caller in errors.
std::unique_ptr<model::ZayaModel> make_model(const ModelSource& source, int64_t batch, int64_t seq,
                                             const std::string& command);
// Applies source.gemm_dtype (an error names anything but f32 and bf16).
void apply_gemm_dtype(const ModelSource& source, model::ZayaModel& m);

}  // namespace zaya::app
