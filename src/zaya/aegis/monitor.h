// Watching one attempt of a supervised job and classifying how it failed (docs/aegis.md,
// "Failure classes"). Pure logic over heartbeats, output lines and the exit status, fed by the
// supervisor's loop, so every rule is testable without processes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zaya/aegis/heartbeat.h"

namespace zaya::aegis {

enum class FailureClass {
  crash,               // a non-zero exit or a signal with no more specific cause
  config_error,        // exit 2: bad input, never retried
  hang,                // no heartbeat progress on some rank past the hang timeout
  collective_timeout,  // exit 3, or the communicator's "timed out ... never arrived" line
  oom,                 // std::bad_alloc / "out of memory" lines, or SIGKILL with OOM-killer hints
  nonfinite,           // exit 4, or a heartbeat reporting a non-finite loss or gradient norm
  loss_spike,          // a loss far above the running statistic of the losses before it
  straggler,           // a rank persistently much slower than the others (reported; no restart by default)
  hardware,            // ECC / Xid / NVRM lines in the output
  ckpt_save,           // exit 5: a checkpoint save failed
  corrupt_checkpoint,  // the newest checkpoint fails verification (found when choosing where to resume)
  preempted,           // stopped by a signal after saving (exit 0, final phase "stopping") without our asking
};
std::string class_name(FailureClass c);

// What the monitor concluded, with the evidence that says why.
struct Detection {
  FailureClass cls = FailureClass::crash;
  std::string evidence;
  int rank = -1;          // the rank at fault when known
  int64_t step = -1;      // the step of the failure when known (nonfinite and spikes: the step reported)
  double detected_at = 0; // unix seconds
  double last_sign_of_life = 0;  // the newest heartbeat before the failure (0: none seen)
};

struct MonitorOptions {
  double hang_timeout_s = 0;      // 0: learned, max(hang_min_s, 2 x median step time + 10 s)
  double hang_min_s = 10;
  // Taken off the learned timeout: the supervisor sees a heartbeat up to a polling interval after
  // it is written and checks once per interval, so with two intervals off a hang is detected
  // within 2 x the step time + 10 s of its last heartbeat (the bar), polling included.
  double detection_margin_s = 0;
  double hang_phase_floor_s = 120;  // floor while a rank is starting, evaluating or saving a checkpoint
  double startup_timeout_s = 0;   // >0: no first heartbeat within this is a hang (when heartbeats are known to exist)
  double spike_z = 6;             // a loss above mean + spike_z x std of the window ...
  double spike_ratio = 1.5;       // ... and above spike_ratio x the mean is a spike
  int spike_window = 50;
  int spike_min_history = 20;
  double straggler_factor = 2;    // step_time >= factor x the median of the others ...
  int straggler_steps = 5;        // ... for this many heartbeats in a row
};

// Patterns of the job's output that classify a failure.
struct LogHints {
  std::string oom_line, hardware_line, collective_timeout_line;
  std::string exec_failed_line;  // the launch command itself could not be executed (Job's message)
  std::string error_line;  // the first "error:" line (zaya's own error report), quoted as evidence
  int missing_rank = -1;  // from "... rank R never arrived"
  // The rank the launcher says failed first: Open MPI's "mpirun noticed that process rank R ..."
  // or "Process name: [[J,S],R]", Slurm's "srun: error: NODE: task R: ...".
  int launcher_rank = -1;
  // The job said it is failing (a collective timeout, an OOM, zaya's own "error:" report): if it
  // has not exited a while later, something is holding it (a stopped rank the launcher cannot end).
  bool fatal = false;
  void scan(const std::string& line);
};

class AttemptMonitor {
 public:
  AttemptMonitor(MonitorOptions opts, double launched_at) : opts_(opts), launched_at_(launched_at) {}

  // Feeds the current heartbeats (read_heartbeats). Returns a detection that must stop the job:
  // a hang, a non-finite value, a loss spike. A straggler is returned once, flagged in `straggler()`.
  std::optional<Detection> observe(const std::map<int, Heartbeat>& beats, double now);
  void scan_line(const std::string& line) { hints_.scan(line); }

  // Classifies the job's exit. `status` is the exit code, or 128 + the signal that killed it.
  Detection classify_exit(int status, double now) const;

  // The straggler found during this attempt, if any (reported as an incident, not a failure).
  const std::optional<Detection>& straggler() const { return straggler_; }
  // The hang timeout now in force for a rank in `phase`.
  double hang_timeout(const std::string& phase) const;

  // How the monitor asks for the state letter of a process ('T': stopped) on `host`; 0 when it cannot
  // be seen (another host, gone). Unset: never asked.
  using ProcessState = std::function<char(const std::string& host, int64_t pid)>;
  void set_process_state(ProcessState f) { process_state_ = std::move(f); }

  bool saw_heartbeats() const { return !ranks_.empty(); }
  int64_t max_step() const { return max_step_; }
  int64_t first_step() const { return first_step_; }
  double first_train_time() const { return first_train_time_; }
  // The training time of the steps above `after` this attempt reached: their count times the
  // median step time (heartbeats are sampled, so not every step's own time is seen).
  double productive_time_after(int64_t after) const;
  std::string final_phase() const;  // the phase of the newest heartbeat of the lowest rank ("" none)
  const std::map<int, Heartbeat>& last() const { return last_; }
  const LogHints& hints() const { return hints_; }

 private:
  struct RankProgress {
    int64_t seq = -1;
    double progressed_at = 0;  // when seq last changed (our clock)
    int slow_in_a_row = 0;
  };
  std::optional<Detection> check_spike(const Heartbeat& h, double now);
  void check_straggler(const std::map<int, Heartbeat>& beats, double now);
  double median_step_time() const;
  Detection make(FailureClass c, std::string evidence, int rank, int64_t step, double now) const;

  MonitorOptions opts_;
  double launched_at_;
  LogHints hints_;
  std::map<int, RankProgress> ranks_;
  std::map<int, Heartbeat> last_;
  std::vector<double> step_times_;      // the lowest rank's, one per step
  std::vector<double> losses_;          // the lowest rank's, one per step (the spike window)
  int64_t last_loss_step_ = -1;
  int64_t max_step_ = -1, first_step_ = -1;
  double first_train_time_ = 0;
  std::optional<Detection> straggler_;
  ProcessState process_state_;
  std::map<int, int64_t> slow_step_;  // the last step each rank's step time was judged at
  bool nonfinite_seen_ = false;
  std::optional<Detection> nonfinite_;  // the first non-finite heartbeat: the trainer decides whether to stop
};

}  // namespace zaya::aegis
