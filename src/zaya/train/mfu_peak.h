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

// The run's peak over its `ranks` ranks (each rank's resolve_mfu_peak for this process's device and
// threads, times the ranks: the records' tokens/s are the world's), printed with its basis. nullopt,
// with a warning, when none is known (a GPU the table lacks, a CPU whose clock is unknown): that
// costs the records their mfu, never the run.
std::optional<PeakFlops> announce_mfu_peak(const RunConfig& cfg, int ranks);

// The names train.mfu_peak accepts, for messages: "auto", "cpu", then the datasheet names.
std::string mfu_peak_choices();

}  // namespace zaya::train
