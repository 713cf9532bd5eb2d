#include "zaya/core/task_progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "zaya/core/log.h"

namespace zaya {
namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string duration(double s) {
  char b[32];
  const long t = static_cast<long>(s + 0.5);
  if (t < 60) std::snprintf(b, sizeof b, "%lds", t);
  else if (t < 3600) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  return b;
}

}  // namespace

TaskProgress::TaskProgress(std::string what, int64_t total, std::string unit, bool enabled)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled && log_level() <= LogLevel::info),
      terminal_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

TaskProgress::~TaskProgress() { finish(); }

void TaskProgress::update(int64_t done) {
  if (!enabled_) return;
  done = std::clamp<int64_t>(done, 0, total_);
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = seconds(now - start_);
  const double eta = done > 0 ? elapsed * static_cast<double>(total_ - done) / static_cast<double>(done) : 0;
  char line[256];
  std::snprintf(line, sizeof line, "%s: %lld/%lld %s (%d%%), %s elapsed%s%s", what_.c_str(),
                static_cast<long long>(done), static_cast<long long>(total_), unit_.c_str(),
                static_cast<int>(100 * done / total_), duration(elapsed).c_str(), done > 0 ? ", ETA " : "",
                done > 0 ? duration(eta).c_str() : "");
  if (terminal_) {
    if (done < total_ && drawn_ && seconds(now - last_draw_) < 0.2) return;
    std::fprintf(stderr, "\r%s\x1b[K", line);
    std::fflush(stderr);
    drawn_ = true;
    last_draw_ = now;
    return;
  }
  const int64_t tenths = 10 * done / total_;
  if (tenths <= logged_tenths_) return;
  logged_tenths_ = tenths;
  log_info(line);
}

void TaskProgress::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace zaya
