// Per-rank heartbeat files for a supervisor (`zaya supervise`, docs/aegis.md, "Trainer side"):
// <out_dir>/heartbeat/rank_<r>.json, one JSON object rewritten atomically (write .tmp, rename) at
// start-up, every step end, evaluation, each checkpoint phase and the end of the run. Liveness
// only: no fsync, and a failed write is reported once and never stops training.
//
// The files are written by a background thread: replacing a small file by rename allocates and
// frees a block each time, which on ext4 (measured: 1-3 ms of I/O wait per write) and on network
// filesystems would be a measurable part of a short step. beat() only hands the event (with its own
// time) to the writer, which writes at most one beat per 20 ms, the newest (seq counts writes);
// flush() writes what is pending at once and waits for it, for the beats a supervisor must see
// before the process ends.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace zaya::train {

class Heartbeat {
 public:
  // Creates <out_dir>/heartbeat/. `rank` of `world` names the file and goes into every beat.
  Heartbeat(const std::string& out_dir, int rank, int world);
  ~Heartbeat();  // flushes
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Queues one beat of `phase` at `step`, carrying the last step's measurements. `error` goes
  // with "failed". Each write gets seq = the previous write's + 1, from 1.
  void beat(const char* phase, int64_t step, const std::string* error = nullptr);
  // Records step `step`'s measurements and queues its "train" beat. `busy_time` is the part of
  // the step this rank spent on its own work, not waiting for the others (see docs/aegis.md).
  void step_end(int64_t step, double loss, double grad_norm, double step_time, double busy_time);
  // Blocks until every queued beat is written.
  void flush();

  int64_t seq() const;  // of the last write
  const std::string& path() const { return path_; }
  static std::string file_name(int rank);  // "rank_00000.json"

 private:
  struct Event {
    std::string phase;
    int64_t step = 0;
    double time = 0;                                   // unix seconds when beat() was called
    std::optional<double> loss, grad_norm, step_time, busy_time;  // the last step's; nullopt before one
    bool nonfinite = false;
    std::optional<std::string> error;
  };
  void write_loop();
  void write(const Event& e);  // on the writer thread

  std::string path_, tmp_, host_;
  int rank_, world_;
  long pid_;
  Event last_step_;  // the measurements carried into every beat
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Event> pending_;  // the newest beat not yet written
  int flushing_ = 0;               // flush() callers waiting: write without waiting out the interval
  bool writing_ = false, stop_ = false;
  int64_t seq_ = 0;
  bool warned_ = false;
  std::thread thread_;
};

}  // namespace zaya::train
