// Where a restarted job continues from, and the command that continues it (docs/aegis.md,
// "The supervisor").
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "zaya/aegis/run_state.h"

namespace zaya::aegis {

struct RejectedCheckpoint {
  int64_t step = 0;
  std::string problem;  // the first problem verification found
};

struct RestartPlan {
  std::optional<std::filesystem::path> resume;  // the step directory to resume from; none: start over
  int64_t resume_step = -1;
  bool rewind = false;                          // the run holds newer checkpoints (moved aside by zaya train)
  bool start_over = false;                      // no checkpoint to resume from: the run starts from step 0
  std::vector<RejectedCheckpoint> rejected;     // newer checkpoints that fail verification (kept)
  std::optional<SkipWindow> skip;               // the data window to skip (a NaN or a spike)
  std::string note;                             // why no window could be computed, when one was asked for
};

// The newest checkpoint of out_dir that verifies; with `step_back` (a NaN or a spike at
// `failing_step`), the one verifying checkpoint before it, and the global samples of the steps
// from there through failing_step + 1 as the window to skip (the reported step may be the last
// completed one or the one that failed; both are covered). The global batch comes from the
// checkpoints' data_loader_next_sample: (n1 - n0) / (s1 - s0) between the two checkpoints, or
// n / s of a single one. Nothing is moved or deleted here.
RestartPlan plan_restart(const std::filesystem::path& out_dir, bool step_back, int64_t failing_step);

// The launch command with {hosts} ("a:2,b:2") and {np} (their total slots) substituted, any
// --resume/--rewind of the user's replaced by the plan's, and the skip windows appended
// (`--skip-samples A:B` each). The arguments go at the end: the command must end with `zaya
// train`'s own arguments (or a wrapper that passes "$@" on to it).
std::vector<std::string> build_command(const std::vector<std::string>& base, const RestartPlan& plan,
                                       const std::vector<SkipWindow>& windows, const std::vector<Host>& hosts);

// The run directory of `zaya train --config C [--set train.out_dir=D]` found in the command, by
// reading the config as the trainer does. A zaya::Error when the command names no --config.
std::filesystem::path run_dir_of_command(const std::vector<std::string>& command);

// Joins argv for display, quoting words with spaces or shell characters.
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace zaya::aegis
