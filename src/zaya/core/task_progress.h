// Progress of one long task that is not a training loop (an evaluation, tokenizer training), on
// stderr, so a command is never silent until it ends. Like the trainer's progress: on a terminal
// one line redrawn in place (at most 5 times a second); otherwise plain log lines, one each time
// another tenth of the work is done (at most 10), which logs and CI output can hold. Nothing below
// the "info" log level (--log-level warn) or when disabled.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace zaya {

class TaskProgress {
 public:
  // `what` names the task ("eval"), `total` the units ("batches") of work it has.
  TaskProgress(std::string what, int64_t total, std::string unit, bool enabled = true);
  ~TaskProgress();  // finish()
  TaskProgress(const TaskProgress&) = delete;
  TaskProgress& operator=(const TaskProgress&) = delete;
  // `done` units of `total` are done (monotone; values past total count as total).
  void update(int64_t done);
  // Ends a terminal line; the next output starts on a line of its own.
  void finish();

 private:
  std::string what_, unit_;
  int64_t total_;
  bool enabled_, terminal_;
  bool drawn_ = false;     // a terminal line is open
  int64_t logged_tenths_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace zaya
