// `zaya supervise`: runs a training job, classifies each failure, restarts it from the newest
// checkpoint that verifies, and keeps records (docs/aegis.md).
#pragma once

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "zaya/aegis/monitor.h"

namespace zaya::aegis {

struct SupervisorOptions {
  std::vector<std::string> command;           // the launch command (argv)
  std::filesystem::path run_dir;              // train.out_dir of the job
  std::optional<std::filesystem::path> hosts_file;
  int max_restarts = 10;                      // restarts after failures before giving up
  double backoff_s = 1;                       // the first restart's delay, doubled per failure in a row
  double backoff_max_s = 60;
  double stop_grace_s = 60;                   // on our own SIGTERM: how long the job may take to save and stop
  int exclude_after = 2;                      // failures blamed on one host before it is excluded
  bool exclude_stragglers = false;            // a straggler's host is excluded (with --hosts) and the job restarted
  double exit_grace_s = 30;                   // a job that reported a fatal error and has not exited by then is killed
  double progress_every_s = 30;               // a progress line this often (0: none)
  double poll_s = 0.2;
  bool echo_output = true;                    // copy the job's output to our stdout (it always goes to the log)
  MonitorOptions monitor;
  const std::atomic<int>* stop_signal = nullptr;  // set by a signal handler: stop the job and exit
};

// Runs until the job finishes (0), the restart budget is spent (1, with a summary), the job
// reports a configuration error (2, not retried), or a stop signal arrives (128 + the signal).
int supervise(const SupervisorOptions& opts);

}  // namespace zaya::aegis
