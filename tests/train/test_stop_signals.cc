// Stop signals: SIGTERM/SIGINT save a checkpoint, also when they arrive twice (timeout, Slurm).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <thread>

#include "train/recovery_fixture.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/train/trainer.h"

namespace zaya::train::recovery {
namespace {

// A stop save in progress (held 2 s by the commit test hook) while `signals` SIGTERMs reach the
// trainer's whole process group, as `timeout` and Slurm send them. Returns the trainer's wait status.
int signal_group_during_save(const std::string& cfg, const fs::path& run, int signals, std::string* log) {
  const fs::path log_path = run.string() + ".log";
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    FILE* f = std::freopen(log_path.c_str(), "w", stderr);
    if (f == nullptr) _exit(126);
    execl(ZAYA_BINARY, ZAYA_BINARY, "--threads", "1", "train", "--config", cfg.c_str(), "--set", "ckpt.every=0",
          "--test-pause-commit-ms", "2000", static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so the group exists whichever of the two runs first
  auto wait_for = [&](auto&& cond) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!cond() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return cond();
  };
  std::error_code ec;
  const bool training = wait_for([&] { return fs::exists(run / "metrics.jsonl", ec) && fs::file_size(run / "metrics.jsonl", ec) > 0; });
  kill(-pid, SIGTERM);
  const bool saving = wait_for([&] {
    for (const auto& e : fs::directory_iterator(run, ec))
      if (e.path().extension() == ".tmp" && e.path().filename().string().rfind("step_", 0) == 0) return true;
    return false;
  });
  for (int i = 1; i < signals; ++i) {
    kill(-pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // each one handled before the next
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(training && saving) << "the trainer never started training or saving";
  *log = file_bytes(log_path);
  return status;
}

// A second SIGTERM while the stop's checkpoint is being written must not cut it short: the save
// commits and the trainer exits 0. A deliberate third one ends it without the save.
TEST_F(RecoveryTest, RepeatedSigtermToTheGroupStillSaves) {
  const std::string cfg = config_file("run", 1000000);
  std::string log;
  const int status = signal_group_during_save(cfg, root_ / "run", 2, &log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status)) : "") << "\n" << log;
  const std::vector<int64_t> steps = ckpt::list_steps(root_ / "run");
  ASSERT_EQ(steps.size(), 1u) << log;
  EXPECT_TRUE(ckpt::Checkpoint(root_ / "run").verify().ok());

  const std::string cfg3 = config_file("three", 1000000);
  const int status3 = signal_group_during_save(cfg3, root_ / "three", 3, &log);
  EXPECT_TRUE(WIFSIGNALED(status3) && WTERMSIG(status3) == SIGTERM) << log;
  EXPECT_TRUE(ckpt::list_steps(root_ / "three").empty()) << "the third signal ended the save";
}

// `timeout` itself (it signals the trainer and then its process group): the run saves, exits 0,
// and --resume continues from that checkpoint.
TEST_F(RecoveryTest, TimeoutSigtermSavesAndResumeContinues) {
  const fs::path run = root_ / "run";
  const std::string cfg = config_file("run", 1000000);
  auto timed = [&](const std::string& args) {
    // ckpt.every = 0: any checkpoint is the stop's.
    return test::run_shell("timeout --preserve-status -k 60 -s TERM 4 " + std::string(ZAYA_BINARY) +
                           " --threads 1 train --config " + cfg + " --set ckpt.every=0 " + args);
  };
  const CliRun first = timed("");
  EXPECT_EQ(first.code, 0) << first.output;
  const std::vector<int64_t> steps = ckpt::list_steps(run);
  ASSERT_EQ(steps.size(), 1u) << first.output;
  const int64_t s = steps[0];
  EXPECT_TRUE(ckpt::Checkpoint(run).verify().ok());
  EXPECT_NE(first.output.find("stopped at step " + std::to_string(s)), std::string::npos) << first.output;

  const CliRun second = timed("--resume");
  EXPECT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from " + (run / ckpt::step_dir_name(s)).string()), std::string::npos)
      << second.output;
  const std::vector<int64_t> after = ckpt::list_steps(run);
  ASSERT_EQ(after.size(), 2u) << second.output;
  EXPECT_GT(after[1], s);
}

}  // namespace
}  // namespace zaya::train::recovery
