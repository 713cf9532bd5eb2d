// Logging: levels, a timestamp and a rank prefix, one line per call, safe across threads.
#pragma once

#include <string>

#include "zaya/core/error.h"

namespace zaya {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

// Process-wide logging settings; set once at start-up by the CLI (and by the launcher's rank).
void set_log_level(LogLevel level);
LogLevel log_level();
void set_log_rank(int rank, int world_size);  // prefix "[rank r/n]" when world_size > 1
LogLevel parse_log_level(const std::string& name);  // "debug" | "info" | "warn" | "error"

void log_line(LogLevel level, const std::string& message);

template <class... Args> void log_debug(Args&&... a) { if (log_level() <= LogLevel::debug) log_line(LogLevel::debug, str(std::forward<Args>(a)...)); }
template <class... Args> void log_info(Args&&... a) { if (log_level() <= LogLevel::info) log_line(LogLevel::info, str(std::forward<Args>(a)...)); }
template <class... Args> void log_warn(Args&&... a) { if (log_level() <= LogLevel::warn) log_line(LogLevel::warn, str(std::forward<Args>(a)...)); }
template <class... Args> void log_error(Args&&... a) { log_line(LogLevel::error, str(std::forward<Args>(a)...)); }

}  // namespace zaya
