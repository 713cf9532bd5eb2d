// The lock on train.out_dir: one trainer per run directory.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "train/recovery_fixture.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/train/trainer.h"

namespace zaya::train::recovery {
namespace {

// Reads the pid, if any, that `run`/.lock names.
std::string lock_text(const fs::path& run) { return fs::exists(run / ".lock") ? file_bytes(run / ".lock") : ""; }

// Two trainers on one run directory: the second (fresh or --resume) is refused at start with a
// message naming the first (pid, host, start time); after a kill -9 of the first, nothing stale
// is left and --resume takes the directory over.
TEST_F(RecoveryTest, SecondTrainerOnARunDirectoryIsRefused) {
  const fs::path run = root_ / "run";
  const std::string cfg = config_file("run", 1000000);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(ZAYA_BINARY, ZAYA_BINARY, "--log-level", "warn", "--threads", "1", "train", "--config", cfg.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  bool saved = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!saved && std::chrono::steady_clock::now() < deadline) {
    saved = fs::exists(run / "step_0000010" / "manifest.json");
    if (!saved) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // `timeout` bounds a second trainer that is wrongly let in.
  auto second = [&](const std::string& args) {
    return test::run_shell("timeout -s KILL 30 " + std::string(ZAYA_BINARY) + " --threads 1 train --config " + cfg + args);
  };
  const CliRun resume = second(" --resume"), fresh = second("");
  const std::string lock = lock_text(run);
  kill(pid, SIGKILL);  // before any assertion, so a failing test never leaves it behind
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(saved) << "the first trainer never saved";
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  for (const CliRun* r : {&resume, &fresh}) {
    EXPECT_EQ(r->code, 2) << r->output;
    EXPECT_NE(r->output.find("pid " + std::to_string(pid)), std::string::npos) << r->output;
    EXPECT_NE(r->output.find(host), std::string::npos) << r->output;
    EXPECT_NE(r->output.find("started"), std::string::npos) << r->output;
  }
  EXPECT_NE(lock.find("pid " + std::to_string(pid)), std::string::npos) << lock;
  // The kill released the lock: a resume starts at once.
  Trainer taken(config("run", 1000000), {.resume = "latest", .quiet = true});
  EXPECT_NE(lock_text(run).find("pid " + std::to_string(getpid())), std::string::npos) << lock_text(run);
}

}  // namespace
}  // namespace zaya::train::recovery
