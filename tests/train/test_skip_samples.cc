// Skipped data windows (`zaya train --skip-samples A:B`, docs/aegis.md "Trainer side"): the
// window arithmetic, and a run that is given a window on resume, and keeps it through a later
// resume without the flag, trains bitwise like a run that had the window from the start.
#include <gtest/gtest.h>

#include <cstring>

#include "train/recovery_fixture.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/error.h"
#include "zaya/train/skip_windows.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {

TEST(SkipWindows, ParseMergeAndSkip) {
  EXPECT_EQ(parse_sample_window("30:37", "--skip-samples"), SampleWindow(30, 37));
  for (const char* bad : {"37:30", "5:5", "a:4", "4", "-1:3", "3:", ":3"}) {
    try {
      parse_sample_window(bad, "--skip-samples");
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("\"") + bad + "\""), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(merge_windows({{10, 20}, {40, 50}}, {{15, 25}, {25, 30}, {0, 2}}),
            (std::vector<SampleWindow>{{0, 2}, {10, 30}, {40, 50}}));
  const std::vector<SampleWindow> w = {{10, 14}, {16, 20}};
  EXPECT_EQ(skip_past_windows(0, 4, w), 0) << "[0, 4) meets no window";
  EXPECT_EQ(skip_past_windows(6, 4, w), 6) << "[6, 10) ends where [10, 14) begins";
  EXPECT_EQ(skip_past_windows(12, 2, w), 14) << "[12, 14) meets [10, 14); [14, 16) meets nothing";
  EXPECT_EQ(skip_past_windows(8, 4, w), 20) << "to 14, then [14, 18) meets [16, 20)";
  EXPECT_EQ(skip_past_windows(20, 4, w), 20);
}

class SkipSamples : public recovery::RecoveryTest {
 protected:
  std::vector<float> run(const std::string& name, int steps, TrainOptions opts,
                         TrainResult* result = nullptr) {
    opts.quiet = true;
    Trainer t(config(name, steps), opts);
    TrainResult r = t.run();
    if (result) *result = r;
    return toy::flat(t.model().params_flat());
  }
};

// The toy step reads 4 global samples (micro-batch 2 x 2 accumulation). Window [30, 37): step 8
// would read [28, 32), so it reads [37, 41) instead, and every later step is shifted alike.
TEST_F(SkipSamples, ResumedWithAWindowEqualsAWindowFromTheStart) {
  const std::vector<float> reference = run("ref", 12, {.skip_samples = {"30:37"}});
  const std::vector<float> plain = run("plain", 12, {});
  ASSERT_EQ(reference.size(), plain.size());
  EXPECT_NE(std::memcmp(reference.data(), plain.data(), plain.size() * sizeof(float)), 0)
      << "the window changes what is trained on";

  run("resumed", 12, {.stop_after_steps = 4});  // a checkpoint at step 4, no window
  // The window given on resume, not reached before this run's stop at step 6.
  run("resumed", 12, {.resume = "latest", .stop_after_steps = 2, .skip_samples = {"30:37"}});
  TrainResult last;
  const std::vector<float> resumed =
      run("resumed", 12, {.resume = "latest"}, &last);  // kept from the checkpoint
  ASSERT_EQ(last.first_step, 6);
  ASSERT_EQ(resumed.size(), reference.size());
  EXPECT_EQ(std::memcmp(resumed.data(), reference.data(), reference.size() * sizeof(float)), 0)
      << "bitwise: the same samples in the same order";
  const nlohmann::json state = ckpt::Checkpoint(root_ / "resumed").manifest().state;
  EXPECT_EQ(state["skip_samples"], nlohmann::json::parse("[[30, 37]]"));
  EXPECT_EQ(state["data_loader_next_sample"], 12 * 4 + (37 - 28))
      << "step 8 skipped [28, 37), not only the window";
}

}  // namespace
}  // namespace zaya::train
