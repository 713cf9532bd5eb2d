// Shared by the tests of the trainer's side of Aegis (docs/aegis.md, "Trainer side"): heartbeat
// files, exit codes, fault injection and skipped data windows, driven through the zaya binary.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "train/recovery_fixture.h"
#include "zaya/ckpt/fs_util.h"

namespace zaya::train::aegis_test {
namespace fs = std::filesystem;
using recovery::file_bytes;

inline const std::string kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE ";

// The heartbeat of `rank` in run directory `run`, if it exists and parses.
inline std::optional<nlohmann::json> heartbeat(const fs::path& run, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.json", rank);
  const std::string text = file_bytes(run / "heartbeat" / name);
  if (text.empty()) return std::nullopt;
  return nlohmann::json::parse(text);  // throws on a torn file: every write is a rename
}

// The per-step records of metrics.jsonl.
inline std::vector<nlohmann::json> step_records(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("time")) out.push_back(j);
  }
  return out;
}

// A `sh -c` command line started in its own process group, its output in `log`.
class Spawned {
 public:
  Spawned(const std::string& cmd, const fs::path& log) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      if (std::freopen(log.c_str(), "w", stderr) == nullptr ||
          std::freopen(log.c_str(), "a", stdout) == nullptr)
        _exit(126);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid_, pid_);
  }
  ~Spawned() {
    if (status_ < 0) {
      kill(-pid_, SIGKILL);
      wait();
    }
  }
  bool running() {
    if (status_ >= 0) return false;
    int s = 0;
    if (waitpid(pid_, &s, WNOHANG) == pid_) status_ = s;
    return status_ < 0;
  }
  int wait() {
    if (status_ < 0) waitpid(pid_, &status_, 0);
    return status_;
  }
  void kill_group() { kill(-pid_, SIGKILL); }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// Polls `cond` every 5 ms for up to `seconds`.
template <class F>
bool wait_until(F&& cond, double seconds = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace zaya::train::aegis_test
