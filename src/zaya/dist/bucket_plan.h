// Gradient buckets for data parallelism: how the ranges a backward reports as final are grouped
// into the collectives that reduce them. Shared by the trainer (train/grad_sync) and the scaling
// simulation (sizing/), so both reason about the same buckets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace zaya::dist {

struct Bucket {
  int64_t begin = 0, end = 0;  // the flat element range
  size_t last_report = 0;      // index in the report order of the report that completes it
  int64_t elements() const { return end - begin; }
};

// Consecutive reports that are adjacent in the buffer (a backward goes from the last layer to the
// first, so each report ends where the bucket so far begins) are grouped, and a bucket closes once
// it holds `bucket_elements` or the next report is not adjacent. Empty reports are skipped.
std::vector<Bucket> plan_buckets(const std::vector<std::pair<int64_t, int64_t>>& report_order, int64_t bucket_elements);

}  // namespace zaya::dist
