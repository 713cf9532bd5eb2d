// The per-step metrics record: a wall-clock timestamp, achieved TFLOP/s, MFU against the given
// peak, and this process's current and peak resident memory, next to the loss and the times.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "zaya/train/step_metrics.h"

namespace zaya::train {
namespace {

TEST(StepRecord, CarriesTimeThroughputAndMemory) {
  StepResult r;
  r.loss = 2.5;
  r.tokens = 4096;
  r.time.step = 0.5;  // 8192 tokens/s
  r.expert_counts = {3, 1};
  r.skipped = {0};
  const ExpertLoads loads = expert_loads(r.expert_counts, r.skipped, 1, 2);
  std::vector<char> ballast(64 << 20, 1);  // resident memory the record must see
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const PeakFlops peak{"h100", 1e13, "test"};
  const nlohmann::json rec = step_record(r, 7, 1 << 20, /*flops_per_token=*/1e9, peak, loads);
  EXPECT_EQ(rec["step"], 7);
  EXPECT_NEAR(rec["wall_time"].get<double>(), now, 60.0);
  EXPECT_DOUBLE_EQ(rec["tokens_per_s"].get<double>(), 8192.0);
  EXPECT_DOUBLE_EQ(rec["tflops"].get<double>(), 8192.0 * 1e9 / 1e12);
  EXPECT_DOUBLE_EQ(rec["mfu"].get<double>(), 8192.0 * 1e9 / 1e13);
  EXPECT_EQ(rec["mfu_peak"], "h100");  // the record names the peak it divides by
  EXPECT_DOUBLE_EQ(rec["mfu_peak_tflops"].get<double>(), 10.0);
  EXPECT_GT(rec["rss_bytes"].get<int64_t>(), 64 << 20);
  EXPECT_GE(rec["peak_rss_bytes"].get<int64_t>(), rec["rss_bytes"].get<int64_t>());
  EXPECT_EQ(ballast[ballast.size() / 2], 1);
}

TEST(StepRecord, WithoutAKnownPeakHasNoMfu) {
  StepResult r;
  r.tokens = 100;
  r.time.step = 1;
  r.expert_counts = {1, 1};
  r.skipped = {0};
  const nlohmann::json rec = step_record(r, 1, 100, 1e9, std::nullopt, expert_loads(r.expert_counts, r.skipped, 1, 2));
  EXPECT_FALSE(rec.contains("mfu"));
  EXPECT_FALSE(rec.contains("mfu_peak"));
  EXPECT_DOUBLE_EQ(rec["tflops"].get<double>(), 100 * 1e9 / 1e12);
}

}  // namespace
}  // namespace zaya::train
