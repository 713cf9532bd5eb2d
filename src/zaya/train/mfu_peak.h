// Which fixed peak a run's MFU divides by (train.mfu_peak, train.mfu_peak_flops; docs/train.md,
// "MFU"): resolved once at start, printed, and named in every metrics.jsonl step record.
#pragma once

#include <optional>
#include <string>

#include "zaya/core/peak_flops.h"
#include "zaya/train/run_config.h"

namespace zaya::train {

// One rank's peak. train.mfu_peak_flops > 0 is a stated figure (named by train.mfu_peak unless that
// is "auto", else "stated"); otherwise train.mfu_peak: "auto" (a GPU's datasheet peak by the name its
// driver reports, `gpu_name`; on the CPU, the formula of cpu_peak for `threads` threads), "cpu" (that
// formula) or a datasheet name (core/peak_flops.h). nullopt: "auto" on a GPU the table does not know.
std::optional<PeakFlops> resolve_mfu_peak(const TrainConfig& t, const std::string& device, int threads,
                                          const std::string& gpu_name);

// The names train.mfu_peak accepts, for messages: "auto", "cpu", then the datasheet names.
std::string mfu_peak_choices();

}  // namespace zaya::train
