// Which checkpoint `zaya train --resume` continues from, and what it does to the run directory
// first (docs/train.md, "Recovery rules"). Called with the run directory's lock held.
#pragma once

#include <filesystem>
#include <string>

namespace zaya::train {

// `resume`: "latest" (the newest checkpoint of out_dir that verifies), a run directory (the same
// rule) or a step directory (that checkpoint, which must verify). Before returning the chosen step
// directory it
//  - moves newer step directories of out_dir that fail verification aside into
//    out_dir/rejected-<time>/, with a warning naming each;
//  - refuses (a zaya::Error quoting the command that rewinds) when out_dir still holds checkpoints
//    newer than the choice, unless `rewind`, which moves them aside into out_dir/rewound-<time>/
//    (kept, never deleted) so that the re-run can save those steps again;
//  - points `latest` at the choice, saying so in the log when it named something else.
std::filesystem::path prepare_resume(const std::filesystem::path& out_dir, const std::string& resume, bool rewind);

}  // namespace zaya::train
