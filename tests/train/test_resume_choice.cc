// Which checkpoint a resume picks: the newest that verifies, whatever `latest` names.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "train/recovery_fixture.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/train/trainer.h"

namespace zaya::train::recovery {
namespace {

using toy::flat;

// A kill -9 after step_0000030/ is committed and before `latest` moves leaves `latest` on step 20
// (planted here): the resume takes step 30, the newest checkpoint that verifies, repairs `latest`,
// and the run ends bitwise where an undisturbed 50-step run ends. Before, every resume trained from
// 20 to 30 and stopped with "step_0000030 already exists".
TEST_F(RecoveryTest, StaleLatestResumesFromTheNewestCheckpoint) {
  Trainer straight(config("straight", 50), {.quiet = true});
  TrainResult a = straight.run();
  const fs::path run = root_ / "run";
  {
    Trainer part(config("run", 50), {.quiet = true, .stop_after_steps = 30});
    ASSERT_TRUE(part.run().interrupted);
  }
  ASSERT_TRUE(fs::exists(run / "step_0000030" / "manifest.json"));
  std::ofstream(run / "latest") << "step_0000020\n";

  testing::internal::CaptureStderr();
  std::optional<Trainer> resumed;
  try {
    resumed.emplace(config("run", 50), TrainOptions{.resume = "latest", .quiet = true});
  } catch (...) {
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("step_0000020"), std::string::npos) << "the log says what `latest` named:\n" << log;
  EXPECT_NE(log.find("step_0000030"), std::string::npos) << log;
  EXPECT_EQ(ckpt::read_latest(run)->filename(), "step_0000030") << "`latest` is repaired";
  TrainResult c = resumed->run();
  ASSERT_EQ(c.first_step, 30);
  ASSERT_EQ(c.losses.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.losses[30 + i], c.losses[i]) << "step " << 30 + i;
  EXPECT_EQ(flat(straight.model().params_flat()), flat(resumed->model().params_flat()));
  EXPECT_EQ(flat(straight.model().balancing_biases()), flat(resumed->model().balancing_biases()));
}

// The newest checkpoint fails verification (a flipped byte in its tensor data): the resume skips it
// with a warning naming it, moves it aside (never deletes it) so that the re-run can save that step
// again, and continues from the next older one, on the undisturbed trajectory.
TEST_F(RecoveryTest, CorruptNewestCheckpointIsSkippedWithAWarning) {
  Trainer straight(config("straight", 40), {.quiet = true});
  TrainResult a = straight.run();
  const fs::path run = root_ / "run";
  {
    Trainer part(config("run", 40), {.quiet = true, .stop_after_steps = 30});
    ASSERT_TRUE(part.run().interrupted);
  }
  const fs::path rank = run / "step_0000030" / "rank_00000.safetensors";
  {
    std::fstream f(rank, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(-5, std::ios::end);
    f.write(&byte, 1);
  }
  ASSERT_FALSE(ckpt::Checkpoint(run / "step_0000030").verify().ok());

  testing::internal::CaptureStderr();
  std::optional<Trainer> resumed;
  try {
    resumed.emplace(config("run", 40), TrainOptions{.resume = "latest", .quiet = true});
  } catch (...) {
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("step_0000030"), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << "the warning says what failed:\n" << log;
  TrainResult c = resumed->run();
  ASSERT_EQ(c.first_step, 20);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.losses[20 + i], c.losses[i]) << "step " << 20 + i;
  EXPECT_EQ(flat(straight.model().params_flat()), flat(resumed->model().params_flat()));
  const std::vector<fs::path> rejected = moved_aside(run, "rejected");
  ASSERT_EQ(rejected.size(), 1u) << "the corrupt checkpoint is kept aside";
  EXPECT_EQ(rejected[0].filename(), "step_0000030");
}

// No checkpoint verifies: the resume stops at start, naming each one and its problem.
TEST_F(RecoveryTest, NoCheckpointThatVerifiesIsAnError) {
  const fs::path run = root_ / "run";
  {
    Trainer part(config("run", 40), {.quiet = true, .stop_after_steps = 10});
    ASSERT_TRUE(part.run().interrupted);
  }
  fs::resize_file(run / "step_0000010" / "rank_00000.safetensors", 100);
  const std::string err = test::error_of([&] { Trainer t(config("run", 40), {.resume = "latest", .quiet = true}); });
  EXPECT_NE(err.find("no checkpoint"), std::string::npos) << err;
  EXPECT_NE(err.find("step_0000010"), std::string::npos) << err;
}

}  // namespace
}  // namespace zaya::train::recovery
