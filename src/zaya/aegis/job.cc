#include "zaya/aegis/job.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "zaya/aegis/heartbeat.h"
#include "zaya/core/error.h"

namespace zaya::aegis {

std::vector<pid_t> session_members(pid_t sid) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(it->path() / "stat");
    std::string stat;
    std::getline(in, stat);
    // pid (comm) state ppid pgrp session ...: comm may hold spaces, so parse after the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    if (rest >> state >> ppid >> pgrp >> session && session == sid && state != "Z") pids.push_back(std::stoi(name));
  }
  return pids;
}

char local_process_state(const std::string& host, int64_t pid) {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || host != name || pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

Job::Job(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  ZAYA_CHECK(!argv.empty(), "zaya supervise: no launch command after --");
  int fds[2];
  ZAYA_CHECK(::pipe(fds) == 0, "zaya supervise: pipe failed: ", std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  ZAYA_CHECK(pid_ >= 0, "zaya supervise: fork failed: ", std::strerror(errno));
  if (pid_ == 0) {
    ::setsid();
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::execvp(args[0], args.data());
    const std::string msg = std::string("zaya supervise: cannot execute ") + argv[0] + ": " + std::strerror(errno) + "\n";
    [[maybe_unused]] ssize_t n = ::write(2, msg.data(), msg.size());
    ::_exit(127);
  }
  ::close(fds[1]);
  out_fd_ = fds[0];
  ::fcntl(out_fd_, F_SETFL, ::fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
}

Job::~Job() {
  if (!exited_ && pid_ > 0) {
    signal_all(SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

bool Job::poll(double timeout_s, const std::function<void(const std::string&)>& on_line,
               const std::function<void(const char*, size_t)>& on_chunk) {
  if (out_fd_ >= 0) {
    pollfd p{out_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) > 0) {
      char buf[65536];
      for (;;) {
        const ssize_t n = ::read(out_fd_, buf, sizeof buf);
        if (n > 0) {
          on_chunk(buf, static_cast<size_t>(n));
          partial_.append(buf, static_cast<size_t>(n));
          for (size_t nl; (nl = partial_.find('\n')) != std::string::npos; partial_.erase(0, nl + 1))
            on_line(partial_.substr(0, nl));
          continue;
        }
        if (n == 0) {  // every writer closed: the job's output is complete
          if (!partial_.empty()) on_line(partial_);
          partial_.clear();
          ::close(out_fd_);
          out_fd_ = -1;
        }
        break;
      }
    }
  } else if (!exited_) {
    ::usleep(static_cast<useconds_t>(timeout_s * 1e6));
  }
  if (!exited_) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      exited_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  return exited_;
}

void Job::signal_all(int sig) const {
  if (pid_ <= 0) return;
  ::kill(-pid_, sig);  // the launcher's process group (= its session id)
  for (pid_t p : session_members(pid_)) {
    ::kill(p, sig);
    if (sig == SIGTERM) ::kill(p, SIGCONT);
  }
}

void Job::kill_all(const std::function<void(const std::string&)>& on_line,
                   const std::function<void(const char*, size_t)>& on_chunk) {
  signal_all(SIGKILL);
  const double until = unix_now() + 10;
  while (!exited_ || out_fd_ >= 0) {
    poll(0.05, on_line, on_chunk);
    if (exited_ && !session_members(pid_).empty()) signal_all(SIGKILL);  // orphaned ranks
    if (unix_now() > until) break;  // a process holding the pipe outside the session: stop reading it
  }
}

void Job::terminate(double grace_s, const std::function<void(const std::string&)>& on_line,
                    const std::function<void(const char*, size_t)>& on_chunk) {
  signal_all(SIGTERM);
  const double until = unix_now() + grace_s;
  while (!exited_ && unix_now() < until) poll(0.1, on_line, on_chunk);
  kill_all(on_line, on_chunk);
}

}  // namespace zaya::aegis
