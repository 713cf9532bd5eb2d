#include "zaya/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace zaya {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::info)};
std::atomic<int> g_rank{0};
std::atomic<int> g_world{1};
std::mutex g_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  throw Error("unknown log level", {.field = "--log-level", .expected = "debug, info, warn or error", .found = name});
}

void log_line(LogLevel level, const std::string& message) {
  static const char kTag[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_world > 1)
    std::fprintf(stderr, "%s %c [rank %d/%d] %s\n", stamp, kTag[static_cast<int>(level)], g_rank.load(),
                 g_world.load(), message.c_str());
  else
    std::fprintf(stderr, "%s %c %s\n", stamp, kTag[static_cast<int>(level)], message.c_str());
}

}  // namespace zaya
