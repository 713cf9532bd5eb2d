#include "zaya/train/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "zaya/core/log.h"

namespace zaya::train {
namespace fs = std::filesystem;

namespace {
nlohmann::json number_or_null(const std::optional<double>& x) {
  if (!x || !std::isfinite(*x)) return nullptr;
  return *x;
}
}  // namespace

std::string Heartbeat::file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.json", rank);
  return name;
}

Heartbeat::Heartbeat(const std::string& out_dir, int rank, int world)
    : rank_(rank), world_(world), pid_(static_cast<long>(::getpid())) {
  const fs::path dir = fs::path(out_dir) / "heartbeat";
  fs::create_directories(dir);
  path_ = (dir / file_name(rank)).string();
  tmp_ = path_ + ".tmp";
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  host_ = host;
}

void Heartbeat::step_end(int64_t step, double loss, double grad_norm, double step_time) {
  last_.loss = loss;
  last_.grad_norm = grad_norm;
  last_.step_time = step_time;
  last_.nonfinite = !std::isfinite(loss) || !std::isfinite(grad_norm);
  beat("train", step);
}

void Heartbeat::beat(const char* phase, int64_t step, const std::string* error) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const nlohmann::json j = {{"rank", rank_},
                            {"world", world_},
                            {"pid", pid_},
                            {"host", host_},
                            {"seq", ++seq_},
                            {"step", step},
                            {"phase", phase},
                            {"time", now},
                            {"loss", number_or_null(last_.loss)},
                            {"grad_norm", number_or_null(last_.grad_norm)},
                            {"step_time", number_or_null(last_.step_time)},
                            {"nonfinite", last_.nonfinite},
                            {"error", error ? nlohmann::json(*error) : nlohmann::json(nullptr)}};
  // A message that is not valid UTF-8 is replaced rather than failing the beat.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  bool ok = false;
  const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ok = (::close(fd) == 0) && ok;
    ok = ok && std::rename(tmp_.c_str(), path_.c_str()) == 0;
  }
  if (!ok && !warned_) {
    warned_ = true;
    log_warn("heartbeat: cannot write ", path_, " (", std::strerror(errno),
             "); training goes on, but a supervisor will see no progress");
  }
}

}  // namespace zaya::train
