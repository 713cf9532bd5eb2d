// Per-rank heartbeat files for a supervisor (`zaya supervise`, docs/aegis.md, "Trainer side"):
// <out_dir>/heartbeat/rank_<r>.json, one JSON object rewritten atomically (write .tmp, rename) at
// start-up, every step end, evaluation, each checkpoint phase and the end of the run. Liveness
// only: no fsync, and a failed write is reported once and never stops training.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zaya::train {

// What the last step of this rank measured; carried into every beat until the next step.
struct HeartbeatStep {
  std::optional<double> loss, grad_norm, step_time;  // nullopt: no step yet
  bool nonfinite = false;  // the last step's loss or gradient norm was NaN or infinite
};

class Heartbeat {
 public:
  // Creates <out_dir>/heartbeat/. `rank` of `world` names the file and goes into every beat.
  Heartbeat(const std::string& out_dir, int rank, int world);

  // Writes one beat (seq = the previous beat's + 1, starting at 1). `error` only with "failed".
  void beat(const char* phase, int64_t step, const std::string* error = nullptr);
  // Records step `step`'s measurements and writes its "train" beat.
  void step_end(int64_t step, double loss, double grad_norm, double step_time);

  int64_t seq() const { return seq_; }
  const std::string& path() const { return path_; }
  static std::string file_name(int rank);  // "rank_00000.json"

 private:
  std::string path_, tmp_, host_;
  int rank_, world_;
  long pid_;
  int64_t seq_ = 0;
  HeartbeatStep last_;
  bool warned_ = false;
};

}  // namespace zaya::train
