#include "zaya/ckpt/run_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <thread>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::ckpt {
namespace fs = std::filesystem;
namespace {

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char s[32];
  std::strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return s;
}

// What the holder wrote: "pid N\nhost H\nstarted T\n".
struct Holder {
  long pid = -1;
  std::string host, started;
};

Holder read_holder(int fd) {
  char buf[1024];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  Holder h;
  if (n <= 0) return h;
  std::istringstream in(std::string(buf, static_cast<size_t>(n)));
  for (std::string key; in >> key;) {
    if (key == "pid") in >> h.pid;
    else if (key == "host") in >> h.host;
    else if (key == "started") in >> h.started;
  }
  return h;
}

// True when the lock is held only for a moment more: the recorded holder (on this host) has exited,
// so what holds it is its forked checkpoint writer, which dies with it; or the holder has just taken
// the lock and not written its line yet.
bool holder_is_leaving(const Holder& h) {
  if (h.pid <= 0) return true;
  return h.host == this_host() && ::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

RunLock::RunLock(const fs::path& run_dir, double grace_s) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw Error(str("cannot create the run directory: ", ec.message()), {.file = run_dir.string()});
  const fs::path path = run_dir / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(str("cannot open the run directory's lock file: ", std::strerror(errno)), {.file = path.string()});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      ::close(fd_);
      throw Error(str("cannot lock the run directory: ", std::strerror(err)), {.file = path.string()});
    }
    const Holder h = read_holder(fd_);
    if (!holder_is_leaving(h) || std::chrono::steady_clock::now() > deadline) {
      ::close(fd_);
      throw Error(str("the run directory is in use by another trainer: pid ", h.pid > 0 ? std::to_string(h.pid) : "?",
                      " on host ", h.host.empty() ? "?" : h.host, ", started ", h.started.empty() ? "?" : h.started,
                      ". Two trainers on one run directory would overwrite each other's checkpoints: wait for it to "
                      "end or stop it (SIGTERM saves a checkpoint first), then resume with --resume"),
                  {.file = path.string()});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string text = str("pid ", ::getpid(), "\nhost ", this_host(), "\nstarted ", utc_now(), "\n");
  // The lock is what matters; the text only names its holder to a refused trainer.
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    log_warn("cannot write this process's pid into ", path.string(), ": ", std::strerror(errno),
             " (the run directory is locked all the same)");
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace zaya::ckpt
