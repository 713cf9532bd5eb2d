#include "zaya/train/progress.h"

#include <unistd.h>

#include <cstdio>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::train {

MetricsSink::MetricsSink(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw Error("cannot open metrics file for writing", {.file = path});
}

void MetricsSink::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

std::string format_duration(double s) {
  char b[32];
  if (s < 0 || s != s) return "?";
  long t = static_cast<long>(s + 0.5);
  if (t < 60) std::snprintf(b, sizeof b, "%lds", t);
  else if (t < 3600) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  return b;
}

Progress::Progress(int64_t first_step, int64_t total_steps, bool bar)
    : first_(first_step), total_(total_steps), bar_(bar && isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t step, double loss, double tokens_per_s, int64_t log_every, const std::string& extra) {
  int64_t done = step + 1;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double per_step = done > first_ ? elapsed / static_cast<double>(done - first_) : 0;
  double eta = per_step * static_cast<double>(total_ - done);
  if (bar_) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total_, 1));
    std::string b(static_cast<size_t>(filled), '#');
    b.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s %s\x1b[K", b.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), loss, tokens_per_s,
                 format_duration(eta).c_str(), extra.c_str());
    std::fflush(stderr);
  } else if (done % log_every == 0 || done == total_ || done == first_ + 1) {
    char line[256];
    std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  %.0f tok/s  elapsed %s  ETA %s", static_cast<long long>(done),
                  static_cast<long long>(total_), loss, tokens_per_s, format_duration(elapsed).c_str(),
                  format_duration(eta).c_str());
    log_info(line, extra.empty() ? "" : "  ", extra);
  }
}

void Progress::finish() {
  if (bar_) std::fprintf(stderr, "\n");
}

}  // namespace zaya::train
