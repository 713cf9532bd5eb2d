// Shared by the tests of a run directory's recovery rules (docs/train.md, "Recovery rules"): a toy
// run with a checkpoint every 10 steps, driven in process or through the zaya binary. Each test
// plants a state that once lost a run and checks the run continues on the undisturbed trajectory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/train/run_config.h"

namespace zaya::train::recovery {
namespace fs = std::filesystem;

using test::CliRun;

inline std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_recovery_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    prefix_ = toy::make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }
  // The toy run `run` of `steps` steps with a checkpoint every 10.
  RunConfig config(const std::string& run, int steps) {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, steps), "toy.toml", {"ckpt.every=10"});
  }
  // The same config as a file, for the binary.
  std::string config_file(const std::string& run, int steps) {
    const fs::path path = root_ / (run + ".toml");
    std::string text = toy::toy_config(prefix_, root_ / run, steps);
    text.replace(text.find("every = 5"), 9, "every = 10");
    std::ofstream(path) << text;
    return path.string();
  }
  CliRun zaya(const std::string& args) {
    return test::run_shell(std::string(ZAYA_BINARY) + " --threads 1 " + args);
  }
  fs::path root_;
  std::string prefix_;
};

// The step directories that were moved into `run`/<prefix>-*/ (rewound or rejected checkpoints).
inline std::vector<fs::path> moved_aside(const fs::path& run, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(run))
    if (e.is_directory() && e.path().filename().string().rfind(prefix + "-", 0) == 0)
      for (const auto& s : fs::directory_iterator(e.path())) out.push_back(s.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace zaya::train::recovery
