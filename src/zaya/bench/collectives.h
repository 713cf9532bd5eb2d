// `zaya bench collectives`: collective microbenchmarks printed exactly as nccl-tests prints them
// (header, size/count/type/redop/root, out-of-place and in-place time/algbw/busbw/#wrong, footer),
// plus CSV and JSON. Conventions follow nccl-tests (see docs/dist.md for the few differences).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/dist/collective_math.h"
#include "zaya/dist/communicator.h"

namespace zaya::bench {

using dist::Coll;
using dist::CollSizes;

struct CollectivesOptions {
  uint64_t min_bytes = 32u << 20, max_bytes = 32u << 20;
  uint64_t step_factor = 1, step_bytes = 1u << 20;
  int iters = 20, warmup = 5, check = 1;
  std::vector<Coll> ops = {Coll::all_reduce};
  DType dtype = DType::f32;
  std::string csv_path, json_path;  // written by rank 0 when set
  std::string command_line;         // recorded in JSON
  void validate() const;            // throws zaya::Error naming the flag at fault
};

struct CollResult {
  Coll op;
  CollSizes sizes;
  int root = -1;
  double time_us[2] = {0, 0}, algbw[2] = {0, 0}, busbw[2] = {0, 0};  // [0] out-of-place, [1] in-place
  int64_t wrong[2] = {0, 0};
};

// The saturation point of one op's sweep: the smallest size whose out-of-place bus bandwidth
// reaches `fraction` of the sweep's best (0 for no rows). A gradient bucket this large moves at
// nearly full speed, and a smaller one leaves more backward to hide behind: docs/data-parallel.md
// derives parallel.bucket_mb from it.
uint64_t saturation_bytes(const std::vector<CollResult>& rows, double fraction = 0.9);

// Runs the sweep on `comm` (every rank calls it), prints the nccl-tests table on rank 0 to `out`,
// and returns every row (on every rank). Throws dist::CollectiveTimeout if a rank stops arriving.
std::vector<CollResult> run_collectives(dist::Communicator& comm, const CollectivesOptions& opt, std::ostream& out);

}  // namespace zaya::bench
