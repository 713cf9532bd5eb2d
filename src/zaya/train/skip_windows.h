// Skipped data windows (`zaya train --skip-samples A:B`, docs/aegis.md, "Trainer side"): ranges
// [A, B) of the training loader's global sample index that the run never trains on, e.g. the data
// of a loss spike a supervisor rewound past. They are stored in every checkpoint's state
// ("skip_samples"), so each later resume keeps skipping them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zaya::train {

using SampleWindow = std::pair<int64_t, int64_t>;  // [first, end) global sample indices

// "A:B" with 0 <= A < B; a zaya::Error naming `what` and the text otherwise.
SampleWindow parse_sample_window(const std::string& text, const std::string& what);

// The union of `a` and `b`, sorted, overlapping and touching windows merged.
std::vector<SampleWindow> merge_windows(std::vector<SampleWindow> a, const std::vector<SampleWindow>& b);

// Where a step that would read global samples [next, next + batch) starts instead: past the end of
// every window its range meets (repeatedly, as a jump may land in the next window).
int64_t skip_past_windows(int64_t next, int64_t batch, const std::vector<SampleWindow>& windows);

nlohmann::json windows_json(const std::vector<SampleWindow>& w);  // [[A, B], ...]
// From a checkpoint state's "skip_samples" (absent: none); `where` names the checkpoint in errors.
std::vector<SampleWindow> windows_from_json(const nlohmann::json& state, const std::string& where);

}  // namespace zaya::train
