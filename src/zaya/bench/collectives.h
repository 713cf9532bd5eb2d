// `zaya bench collectives`: collective microbenchmarks printed exactly as nccl-tests prints them
// (header, size/count/type/redop/root, out-of-place and in-place time/algbw/busbw/#wrong, footer),
// plus CSV and JSON. Conventions follow nccl-tests (see docs/dist.md for the few differences).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/dist/communicator.h"

namespace zaya::bench {

enum class Coll { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };
constexpr Coll kAllColls[] = {Coll::all_reduce, Coll::reduce_scatter, Coll::all_gather, Coll::broadcast,
                              Coll::all_to_all};
std::string_view coll_name(Coll c);  // "all_reduce", ...
// "all_reduce" | ... | "all" (every op); throws zaya::Error naming --op otherwise.
std::vector<Coll> parse_colls(const std::string& name);

// Per-rank element counts for one test size, as nccl-tests' GetCollByteCount computes them:
// count = bytes / type size, then rounded down to a multiple of the rank count for the ops that
// split the array (reduce_scatter, all_gather, all_to_all).
struct CollSizes {
  size_t send_count = 0;  // elements each rank sends
  size_t recv_count = 0;  // elements each rank receives
  size_t count = 0;       // the count passed to the collective, printed in the "count" column
  size_t bytes = 0;       // the "size" column and the S of algbw: max(send, recv) * type size
};
CollSizes coll_sizes(Coll c, size_t bytes, size_t type_size, int nranks);
// busbw = algbw * factor: all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n;
// broadcast 1.
double bus_factor(Coll c, int nranks);

// "8", "64K", "64M", "1G" (K = 1024, as nccl-tests), also "1.5M"; throws zaya::Error naming `flag`
// for anything else (negative, empty, unknown suffix, overflow).
uint64_t parse_size(const std::string& text, const std::string& flag);
// The sizes a sweep visits: min, then times factor (factor > 1) or plus step, up to max.
std::vector<uint64_t> sweep_sizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t factor, uint64_t step);

// nccl-tests' time column: "%7.0f" from 10 ms, "%7.1f" from 100 us, else "%7.2f".
std::string format_time_us(double us);

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

// Runs the sweep on `comm` (every rank calls it), prints the nccl-tests table on rank 0 to `out`,
// and returns every row (on every rank). Throws dist::CollectiveTimeout if a rank stops arriving.
std::vector<CollResult> run_collectives(dist::Communicator& comm, const CollectivesOptions& opt, std::ostream& out);

}  // namespace zaya::bench
