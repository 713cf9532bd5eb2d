// What a checkpoint says about itself against what it holds, for Checkpoint::verify: checksums
// vouch for the bytes, not for a manifest edited (or a directory renamed) after the commit.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "zaya/ckpt/manifest.h"

namespace zaya::ckpt {

// The manifest's step against the step directory's name (step_NNNNNNN; other names are not
// checked) and against the state's "step" when it has one. One message per disagreement.
std::vector<std::string> step_problems(const Manifest& m, const std::filesystem::path& dir);

// The state's "model_config" (transformers schema; absent: nothing to check) against the tensors:
// every parameter and balancing bias it implies must be present with its shape, and no tensor may
// belong to a layer it does not have. Each message names the config field and the tensor.
std::vector<std::string> model_config_problems(const Manifest& m, const std::filesystem::path& dir);

}  // namespace zaya::ckpt
