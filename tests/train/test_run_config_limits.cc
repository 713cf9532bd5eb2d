// Run-config bounds that protect the trainer's 64-bit counters, and a config path that is a
// directory (which used to read as an empty config and fail on an unrelated key).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "toy.h"
#include "zaya/train/run_config.h"

namespace zaya::train {
namespace {

std::string parse_error(const std::vector<std::string>& overrides) {
  return zaya::test::error_of(
      [&] { parse_run_config(toy::toy_config("unused_prefix", "unused_out", 10), "toy.toml", overrides); });
}

// train.steps = 9223372036854775807 overflowed steps x tokens per step (2 x 16 x 2 = 64 here).
TEST(RunConfigLimits, StepsTimesTokensPerStepMustFitInt64) {
  const std::string e = parse_error({"train.steps=9223372036854775807"});
  EXPECT_NE(e.find("toy.toml: train.steps"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 144115188075855871 (steps x 64 tokens per step must fit a 64-bit token count)"),
            std::string::npos)
      << e;
  EXPECT_EQ(parse_error({"train.steps=144115188075855871", "optim.total_steps=10"}), "");
  const std::string accum = parse_error({"train.grad_accum=9223372036854775807"});
  EXPECT_NE(accum.find("train.grad_accum"), std::string::npos) << accum;
}

TEST(RunConfigLimits, ConfigPathThatIsADirectoryIsNamedAsOne) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string e = zaya::test::error_of([&] { load_run_config(dir, {}); });
  EXPECT_NE(e.find(dir + ": is a directory; expected a TOML config file"), std::string::npos) << e;
}

}  // namespace
}  // namespace zaya::train

namespace zaya::train {
namespace {

// A short try-out of a long run's config: a warm-up (plus the WSD decay) longer than the run is
// shortened to fit instead of refused; an explicit optim.total_steps is still checked as written.
TEST(RunConfigLimits, WarmupLongerThanAShortRunIsShortenedToFit) {
  const std::string text = toy::toy_config("unused_prefix", "unused_out", 20);
  const RunConfig c = parse_run_config(text, "toy.toml", {"optim.warmup_steps=100", "optim.decay_fraction=0.3"});
  EXPECT_EQ(c.optim.total_steps, 20);
  EXPECT_EQ(c.optim.warmup_steps, 14);  // 20 steps - a 6-step decay
  EXPECT_EQ(c.values.at("optim.warmup_steps"), "14");
  const RunConfig fits = parse_run_config(text, "toy.toml", {"optim.warmup_steps=3"});
  EXPECT_EQ(fits.optim.warmup_steps, 3);
  EXPECT_THROW(parse_run_config(text, "toy.toml", {"optim.warmup_steps=100", "optim.total_steps=50"}), Error);
}

}  // namespace
}  // namespace zaya::train
