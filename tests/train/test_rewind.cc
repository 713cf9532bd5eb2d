// Resuming from an older checkpoint (--rewind) and resuming a finished run.
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

// Resuming from an older checkpoint while newer ones exist stops at start with the command that
// rewinds; --rewind moves the newer ones aside (kept, not deleted) and the re-run saves the same
// bytes again. Resuming a finished run says so and exits 0.
TEST_F(RecoveryTest, OlderCheckpointNeedsRewindAndFinishedRunHasNothingToDo) {
  const fs::path run = root_ / "run";
  const std::string cfg = config_file("run", 30);
  CliRun r = zaya("--log-level warn train --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(ckpt::list_steps(run), (std::vector<int64_t>{10, 20, 30}));
  const std::string final30 = file_bytes(run / "step_0000030" / "rank_00000.safetensors");
  const std::string metrics = file_bytes(run / "metrics.jsonl");

  r = zaya("train --config " + cfg + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to do"), std::string::npos) << r.output;
  EXPECT_TRUE(file_bytes(run / "metrics.jsonl") == metrics) << "a finished run trains no step";

  const std::string older = (run / "step_0000010").string();
  r = zaya("train --config " + cfg + " --resume " + older);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--resume " + older + " --rewind"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_0000020"), std::string::npos) << r.output;
  EXPECT_TRUE(file_bytes(run / "metrics.jsonl") == metrics) << "refused before training";

  r = zaya("train --config " + cfg + " --rewind");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--rewind"), std::string::npos) << r.output;

  r = zaya("--log-level warn train --config " + cfg + " --resume " + older + " --rewind");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<fs::path> rewound = moved_aside(run, "rewound");
  ASSERT_EQ(rewound.size(), 2u);
  EXPECT_EQ(rewound[0].filename(), "step_0000020");
  EXPECT_EQ(rewound[1].filename(), "step_0000030");
  EXPECT_TRUE(file_bytes(rewound[1] / "rank_00000.safetensors") == final30) << "the rewound checkpoint is intact";
  EXPECT_EQ(ckpt::read_latest(run)->filename(), "step_0000030");
  EXPECT_TRUE(file_bytes(run / "step_0000030" / "rank_00000.safetensors") == final30)
      << "steps 11-30 again give the same bytes";
}

}  // namespace
}  // namespace zaya::train::recovery
