// Run output: a progress bar on a terminal, plain log lines otherwise, and metrics as JSONL.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace zaya::train {

// metrics.jsonl: one JSON object per line, each record written whole or not at all.
//
// A write that fails (disk full, a file-size limit) is reported at once with a warning, and the
// file is cut back to its last whole record, so a torn line is never left for the next record to
// be appended to; training goes on, and when writes succeed again the count of lost records is
// logged. Opening for a resumed run at step S first drops, from the end of the file, a torn last
// line (a crash in the middle of a write) and the records of steps after S (written before a crash
// and replayed now), with one ftruncate: the file then holds each step once (docs/train.md).
class MetricsSink {
 public:
  MetricsSink() = default;
  // `resume_step` 0: a fresh run (the file is truncated); S > 0: the run resumes after step S.
  MetricsSink(const std::string& path, int64_t resume_step);
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  void write(const nlohmann::json& record);
  bool open() const { return fd_ >= 0; }
  int64_t lost_records() const { return lost_total_; }  // records whose write failed

 private:
  // Cuts a torn last line and the records of steps after `resume_step` (> 0) off the open file.
  void drop_after(int64_t resume_step);

  std::string path_;
  int fd_ = -1;
  int64_t good_size_ = 0;    // the file's size after the last whole record
  int64_t lost_streak_ = 0;  // failed writes since the last one that succeeded
  int64_t lost_total_ = 0;
};

class Progress {
 public:
  // `bar`: draw a progress bar (only honoured when stderr is a terminal).
  Progress(int64_t first_step, int64_t total_steps, bool bar);
  // Called every step; redraws the bar, or logs a plain line every `log_every` steps.
  void update(int64_t step, double loss, double tokens_per_s, int64_t log_every, const std::string& extra = "");
  void finish();  // ends the bar's line
  bool is_bar() const { return bar_; }

 private:
  int64_t first_, total_;
  bool bar_;
  std::chrono::steady_clock::time_point start_;
};

std::string format_duration(double seconds);  // "3m20s", "1h02m"

}  // namespace zaya::train
