// One launch of the supervised command: its own session (setsid), its output through a pipe, and
// ending it whole — every process of the session, including ranks that an MPI launcher put in
// process groups of their own and a SIGSTOPped one (SIGKILL ends a stopped process).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace zaya::aegis {

class Job {
 public:
  // Starts argv in a new session with `env` added ("KEY=VALUE" each). A command that cannot be
  // executed exits 127, as a shell's does.
  Job(const std::vector<std::string>& argv, const std::vector<std::string>& env);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to timeout_s for output, handing each complete line (without '\n') and each raw chunk
  // to the callbacks; then reaps the launcher if it exited. Returns true once it has exited.
  bool poll(double timeout_s, const std::function<void(const std::string&)>& on_line,
            const std::function<void(const char*, size_t)>& on_chunk);
  bool exited() const { return exited_; }
  int status() const { return status_; }  // exit code, or 128 + the signal

  // Sends `sig` to every process of the job's session (and SIGCONT after SIGTERM, so a stopped
  // process can act on it).
  void signal_all(int sig) const;
  // SIGKILL to the whole session, then reaps the launcher and drains the output.
  void kill_all(const std::function<void(const std::string&)>& on_line,
                const std::function<void(const char*, size_t)>& on_chunk);
  // SIGTERM, up to grace_s for the launcher to exit, then kill_all.
  void terminate(double grace_s, const std::function<void(const std::string&)>& on_line,
                 const std::function<void(const char*, size_t)>& on_chunk);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string partial_;
};

// Processes whose session id is `sid` (from /proc). Used to end a job left running by a
// supervisor that was killed.
std::vector<pid_t> session_members(pid_t sid);

// The state letter of process `pid` from /proc (R, S, D, T for stopped, ...) when `host` is this
// machine's hostname; 0 otherwise or when the process is gone.
char local_process_state(const std::string& host, int64_t pid);

}  // namespace zaya::aegis
