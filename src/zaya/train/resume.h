// Which checkpoint `zaya train --resume` continues from, and what it does to the run directory
// first (docs/train.md, "Recovery rules"). Called with the run directory's lock held.
#pragma once

#include <filesystem>
#include <string>

namespace zaya::train {

// `resume`: "latest" (the newest checkpoint of out_dir that verifies), a run directory (the same
// rule) or a step directory (that checkpoint). Logs when `latest` disagrees with the choice and
// points it at the choice; moves newer step directories of out_dir that failed verification
// aside into out_dir/rejected-<time>/ (with a warning naming each), so the re-run can save those
// steps again. Returns the chosen step directory.
std::filesystem::path prepare_resume(const std::filesystem::path& out_dir, const std::string& resume);

}  // namespace zaya::train
