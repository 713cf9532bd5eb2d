// `zaya size --measured-step-s`: a measured step next to the hardware profile's prediction, so a
// profile is checked against the kernels it stands for.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "sizing/zaya1_base_shape.h"
#include "zaya/core/error.h"
#include "zaya/sizing/hardware.h"
#include "zaya/sizing/size_report.h"

namespace zaya::sizing {
namespace {

// ZAYA1-base's layer shape with 8 layers at one 4096-token sequence: the GPU benchmark's model.
SizeReport base_report(const std::optional<HardwareProfile>& hw) {
  const model::ModelConfig c = test::zaya1_base_shape(8);
  RunShape run;
  run.mbs = 2;
  run.seq = 4096;
  return size_model(c, run, hw);
}

TEST(SizeMeasured, PrintsBothTimesTheirRatioAndBothMfus) {
  const SizeReport r = base_report(builtin_profile("h200"));
  ASSERT_GT(r.step_time_s, 0);
  const double measured = 2.0 * r.step_time_s;  // a step twice as long as predicted
  const std::string out = format_measured_step(r, measured);
  double m = 0, p = 0, ratio = 0, tps = 0, mfu_m = 0, mfu_p = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "measured       step %lf s against %lf s predicted on h200 (measured / predicted %lf), %lf tokens/s",
                        &m, &p, &ratio, &tps),
            4)
      << out;
  // Printed to four significant digits and the ratio to two decimals.
  EXPECT_NEAR(m, measured, 1e-3 * measured);
  EXPECT_NEAR(p, r.step_time_s, 1e-3 * r.step_time_s);
  EXPECT_NEAR(ratio, 2.0, 0.005);
  EXPECT_NEAR(tps, 2.0 * 4096 / measured, 1.0);  // printed to a whole token
  const size_t at = out.find("mfu ");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "mfu %lf%% measured, %lf%% predicted", &mfu_m, &mfu_p), 2) << out;
  // Twice the time is half the MFU (each printed to 0.1 percentage points).
  EXPECT_NEAR(mfu_p, 100 * r.mfu, 0.051);
  EXPECT_NEAR(mfu_m, 100 * r.mfu / 2, 0.051);
}

TEST(SizeMeasured, NeedsAProfileAndAPositiveTime) {
  try {
    format_measured_step(base_report(std::nullopt), 1.0);
    FAIL() << "no error without a profile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add --hw"), std::string::npos) << e.what();
  }
  const SizeReport r = base_report(builtin_profile("h100"));
  for (double bad : {0.0, -1.0}) {
    try {
      format_measured_step(r, bad);
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected a positive number of seconds"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace zaya::sizing
