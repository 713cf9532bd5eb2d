// Run output: a progress bar on a terminal, plain log lines otherwise, and metrics as JSONL.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace zaya::train {

// Appends one JSON object per line and flushes, so a crash loses at most the line being written.
class MetricsSink {
 public:
  MetricsSink() = default;
  explicit MetricsSink(const std::string& path, bool append);
  void write(const nlohmann::json& record);
  bool open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
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
