// Reading the trainer's heartbeats (the Aegis contract: <out_dir>/heartbeat/rank_<r>.json, one
// JSON object per rank, replaced atomically at every step and phase change; docs/aegis.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace zaya::aegis {

struct Heartbeat {
  int rank = 0;
  int world = 1;
  int64_t pid = 0;
  std::string host;
  int64_t seq = 0;   // +1 with every write of this rank: progress even within one phase
  int64_t step = 0;
  std::string phase;  // start, train, eval, ckpt-snapshot, ckpt-write, ckpt-commit, done, stopping, failed
  double time = 0;    // unix seconds of the write
  std::optional<double> loss, grad_norm, step_time;
  // The step time less the rank's waits for the others (absent from older trainers): in synchronous
  // data parallelism every rank's step_time is the slowest rank's, so stragglers are found by this.
  std::optional<double> busy_time;
  bool nonfinite = false;
  std::string error;
};

// Parses one heartbeat; nullopt when the text is not a complete heartbeat object (a reader must
// never trust a half-read or foreign file; the writer's rename makes that rare).
std::optional<Heartbeat> parse_heartbeat(const std::string& text);

// Every rank's heartbeat in out_dir/heartbeat/ written at or after `since` (unix seconds): older
// files are a previous attempt's. Unreadable files are skipped.
std::map<int, Heartbeat> read_heartbeats(const std::filesystem::path& out_dir, double since);

// Seconds since the Unix epoch, as the heartbeats' "time".
double unix_now();

}  // namespace zaya::aegis
