// `zaya bench membw`: STREAM-style memory bandwidth (copy, scale, add, triad) versus array size and
// thread count. Bytes are counted as STREAM counts them: per element of double, copy and scale move
// 16 bytes (one read, one write), add and triad 24 (two reads, one write); write-allocate traffic
// is not counted. Each rate is the best over the iterations, as STREAM reports.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace zaya::bench {

enum class StreamKernel { copy, scale, add, triad };
// Bytes STREAM counts for one pass of `kernel` over arrays of `n` doubles.
uint64_t stream_bytes(StreamKernel kernel, uint64_t n);

struct MembwOptions {
  uint64_t min_bytes = 1u << 20, max_bytes = 256u << 20;  // per array
  uint64_t factor = 4;
  std::vector<int> threads;  // empty: 1 and all hardware threads
  int iters = 10;
  std::string json_path;
  void validate() const;
};

struct MembwRow {
  uint64_t array_bytes = 0;
  int threads = 0;
  double gbs[4] = {0, 0, 0, 0};  // copy, scale, add, triad; GB = 1e9 bytes
  bool valid = true;             // the arrays hold STREAM's expected values afterwards
};

std::vector<MembwRow> run_membw(const MembwOptions& options, std::ostream& out);
// "1,2,4" -> {1, 2, 4}; throws zaya::Error naming `flag` on anything else.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag);

}  // namespace zaya::bench
