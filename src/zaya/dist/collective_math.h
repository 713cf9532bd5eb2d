// The arithmetic of collective benchmarks, as nccl-tests defines it: per-rank counts for a test
// size, bus-bandwidth factors, size parsing ("64M") and the size sweep. Pure functions, used by
// `zaya bench collectives` and by bucket sizing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zaya::dist {

// The _v forms run with every rank's count equal, so that their rows compare directly with the
// fixed-count forms: same sizes, same bytes moved, only the implementation differs (on NCCL,
// grouped reduces or broadcasts instead of one reduce_scatter or all_gather).
enum class Coll { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, reduce_scatter_v, all_gather_v };
constexpr Coll kAllColls[] = {Coll::all_reduce, Coll::reduce_scatter, Coll::all_gather,      Coll::broadcast,
                              Coll::all_to_all, Coll::reduce_scatter_v, Coll::all_gather_v};
std::string_view coll_name(Coll c);  // "all_reduce", ...
// The fixed-count collective whose sizes, data layout and results a _v form shares (c itself for
// the others).
Coll fixed_count_form(Coll c);
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

}  // namespace zaya::dist
