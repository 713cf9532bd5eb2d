// The goodput model under failures: the formula at a hand-computed point, Young's interval, the
// numerical optimum agreeing with it where the first-order model holds, no goodput when failures
// outpace recovery, bad inputs named, and the CLI table.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/sizing/goodput.h"

namespace zaya::sizing {
namespace {

TEST(Goodput, FormulaYoungAndTheOptimum) {
  GoodputModel m;
  m.gpus = 1;
  m.failures_per_gpu_hour = 0.1;  // λ = 1 / 36000 s
  m.ckpt_stall_s = 10;
  m.detect_s = 0;
  m.recover_s = 0;
  // 600 / 610 × (1 − (610 / 2) / 36000)
  EXPECT_NEAR(goodput(m, 600), 600.0 / 610.0 * (1 - 305.0 / 36000.0), 1e-12);
  EXPECT_NEAR(young_interval_s(m), std::sqrt(2 * 10 * 36000.0), 1e-9);
  // With C ≪ 1/λ the first-order optimum is Young's, to a few percent.
  EXPECT_NEAR(best_interval_s(m) / young_interval_s(m), 1.0, 0.05);
  // The optimum is a maximum: both neighbours are lower.
  const double best = best_interval_s(m);
  EXPECT_GT(goodput(m, best), goodput(m, best * 0.8));
  EXPECT_GT(goodput(m, best), goodput(m, best * 1.25));
  // Detection and recovery cost goodput at any interval.
  GoodputModel slow = m;
  slow.recover_s = 600;
  EXPECT_NEAR(goodput(m, 600) - goodput(slow, 600), 600.0 / 610.0 * 600.0 / 36000.0, 1e-12);
  // Failures faster than recovery: nothing gets done.
  slow.failures_per_gpu_hour = 100;
  EXPECT_EQ(goodput(slow, 600), 0.0);
  EXPECT_EQ(goodput(m, 0), 0.0);
}

TEST(Goodput, BadInputIsNamed) {
  GoodputModel m;
  m.gpus = 0;
  EXPECT_THROW(m.validate(), Error);
  m = GoodputModel{};
  m.ckpt_stall_s = 0;
  try {
    m.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ckpt-stall-s"), std::string::npos) << e.what();
  }
}

TEST(Goodput, CliPrintsTheTableAndTheRecommendation) {
  const test::CliRun r = test::run_zaya("simulate --goodput --gpus 1024");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("MTBF 49.5 h"), std::string::npos) << r.output;  // Llama 3's rate at 1,024 GPUs
  EXPECT_NE(r.output.find("Young's interval"), std::string::npos) << r.output;
  const test::CliRun bad = test::run_zaya("simulate --goodput --recover-s -1");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--recover-s"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace zaya::sizing
