#include "zaya/train/progress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::train {

namespace {

[[noreturn]] void metrics_error(const std::string& what, const std::string& path, int err) {
  throw Error(str("metrics: ", what, ": ", std::strerror(err)), {.file = path});
}

// The line that ends at byte `end` (exclusive; a '\n' at end - 1 is not part of it) of the open
// file: its start offset and text. Lines are read backwards in pieces, so a resume looks only at
// the file's tail however long the run was.
std::pair<int64_t, std::string> line_before(int fd, int64_t end, const std::string& path) {
  int64_t text_end = end;
  std::string text;
  char c = 0;
  if (end > 0 && ::pread(fd, &c, 1, end - 1) == 1 && c == '\n') --text_end;
  int64_t pos = text_end;
  constexpr int64_t kPiece = 4096;
  while (pos > 0) {
    const int64_t n = std::min(kPiece, pos);
    std::string buf(static_cast<size_t>(n), '\0');
    const ssize_t got = ::pread(fd, buf.data(), static_cast<size_t>(n), pos - n);
    if (got != n) metrics_error("cannot read", path, got < 0 ? errno : EIO);
    const size_t nl = buf.rfind('\n');
    if (nl != std::string::npos) {
      text.insert(0, buf.substr(nl + 1));
      return {pos - n + static_cast<int64_t>(nl) + 1, text};
    }
    text.insert(0, buf);
    pos -= n;
  }
  return {0, text};
}

}  // namespace

MetricsSink::MetricsSink(const std::string& path, int64_t resume_step) : path_(path) {
  const int flags = O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (resume_step > 0 ? 0 : O_TRUNC);
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) metrics_error("cannot open for writing", path, errno);
  try {
    drop_after(resume_step);
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    fd_ = -1;
    throw;
  }
}

void MetricsSink::drop_after(int64_t resume_step) {
  const std::string& path = path_;
  struct stat st {};
  if (::fstat(fd_, &st) != 0) metrics_error("cannot stat", path, errno);
  const int64_t size = st.st_size;
  // Walk back from the end over a torn last line and the records after the resumed step; stop at
  // the first whole record of a step <= S (or one without a step, which is kept).
  int64_t keep = size, dropped = 0;
  bool torn = false;
  while (resume_step > 0 && keep > 0) {
    const auto [start, text] = line_before(fd_, keep, path);
    char last = 0;
    const bool whole = ::pread(fd_, &last, 1, keep - 1) == 1 && last == '\n';
    if (!whole) {
      torn = true;
    } else if (text.empty()) {
      // an empty line: nothing to keep or drop
    } else {
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_discarded()) {
        torn = true;  // a whole line that is not JSON: a torn record that another was appended to
      } else {
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
            j["step"].get<int64_t>() <= resume_step)
          break;
        ++dropped;
      }
    }
    keep = start;
  }
  if (keep < size) {
    if (::ftruncate(fd_, keep) != 0) metrics_error("cannot cut back the records after the resumed step", path, errno);
    if (::fsync(fd_) != 0) metrics_error("cannot fsync", path, errno);
    log_info("metrics: resuming after step ", resume_step, ": dropped ", dropped, " record", dropped == 1 ? "" : "s",
             " of later steps (written before the run stopped; this run writes them again)",
             torn ? " and a torn line" : "", " from ", path);
  }
  good_size_ = keep;
}

MetricsSink::~MetricsSink() {
  if (fd_ < 0) return;
  if (lost_streak_ > 0)
    log_warn("metrics: the last ", lost_streak_, " records could not be written to ", path_, " (", lost_total_,
             " lost in all)");
  ::close(fd_);
}

void MetricsSink::write(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const std::string line = record.dump() + '\n';
  size_t done = 0;
  int err = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      err = w < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(w);
  }
  const int64_t step = record.is_object() && record.contains("step") && record["step"].is_number_integer()
                           ? record["step"].get<int64_t>()
                           : -1;
  if (err == 0) {
    good_size_ += static_cast<int64_t>(line.size());
    if (lost_streak_ > 0)
      log_warn("metrics: writing to ", path_, " again at step ", step, "; ", lost_streak_, " record",
               lost_streak_ == 1 ? " was" : "s were", " lost");
    lost_streak_ = 0;
    return;
  }
  ++lost_total_;
  if (lost_streak_++ == 0)
    log_warn("metrics: cannot write the record of step ", step, " to ", path_, ": ", std::strerror(err),
             "; training goes on, and records are lost until a write succeeds");
  // Cut the torn piece off, so the next record starts on a line of its own. Shrinking a file
  // needs no space; if it still fails, the file is no longer written (a torn line must not be
  // extended by the next record).
  if (::ftruncate(fd_, good_size_) != 0) {
    log_warn("metrics: cannot cut the torn record off ", path_, " (", std::strerror(errno),
             "); no more metrics are written this run");
    ::close(fd_);
    fd_ = -1;
  }
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
