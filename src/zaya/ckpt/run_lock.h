// One trainer per run directory: an exclusive flock(2) on RUN_DIR/.lock, held for the trainer's
// lifetime (docs/checkpoint-format.md, "Recovery rules").
//
// The kernel drops the lock when the last descriptor of the open file goes away, so a process
// killed with kill -9 never leaves a stale lock behind; the file itself stays, holding the pid, host
// and start time of the last holder, which is what a refused trainer prints. A checkpoint writer
// forked by the holder shares the lock until it exits (it dies with the trainer).
#pragma once

#include <filesystem>

namespace zaya::ckpt {

class RunLock {
 public:
  // Creates run_dir if needed and takes the lock, or throws a zaya::Error naming the process that
  // holds it (pid, host, start time). When the recorded holder has exited but the lock is still
  // held (its forked checkpoint writer is being killed), waits up to `grace_s` for it.
  explicit RunLock(const std::filesystem::path& run_dir, double grace_s = 10);
  ~RunLock();  // releases the lock
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace zaya::ckpt
