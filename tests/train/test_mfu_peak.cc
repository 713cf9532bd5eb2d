// The run's MFU peak: train.mfu_peak / train.mfu_peak_flops resolve to a fixed, named figure (a
// stated one, a datasheet's, or the CPU formula), bad values are errors naming the key, and a run's
// metrics.jsonl records all divide by that one figure and name it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/core/threads.h"
#include "zaya/train/config_change.h"
#include "zaya/train/mfu_peak.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

TEST(MfuPeak, ResolvesStatedDatasheetAndCpuPeaks) {
  TrainConfig t;
  // "auto" on the CPU: the formula for the run's threads.
  const std::optional<PeakFlops> cpu = resolve_mfu_peak(t, "cpu", 1, "");
  ASSERT_TRUE(cpu.has_value());
  EXPECT_EQ(cpu->name, "cpu");
  EXPECT_DOUBLE_EQ(cpu->flops_per_s, cpu_peak(detect_cpu(1)).flops_per_s);
  // "auto" on a GPU: its datasheet peak by the driver's name; unknown GPUs have none.
  EXPECT_EQ(resolve_mfu_peak(t, "cuda", 1, "NVIDIA H100 80GB HBM3")->name, "h100");
  EXPECT_FALSE(resolve_mfu_peak(t, "cuda", 1, "NVIDIA GeForce RTX 4090").has_value());
  // A datasheet name wins over the device.
  t.mfu_peak = "mi300x";
  EXPECT_DOUBLE_EQ(resolve_mfu_peak(t, "cpu", 1, "")->flops_per_s, 1307e12);
  // A stated figure wins over everything, keeping a name given with it.
  t.mfu_peak_flops = 2.5e11;
  EXPECT_EQ(resolve_mfu_peak(t, "cuda", 1, "")->name, "mi300x");
  EXPECT_DOUBLE_EQ(resolve_mfu_peak(t, "cuda", 1, "")->flops_per_s, 2.5e11);
  t.mfu_peak = "auto";
  EXPECT_EQ(resolve_mfu_peak(t, "cpu", 1, "")->name, "stated");
}

class MfuPeakRun : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("zaya_mfu_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    prefix_ = toy::make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }
  RunConfig config(const std::vector<std::string>& overrides) {
    return parse_run_config(toy::toy_config(prefix_, root_ / "run", 3), "mfu.toml", overrides);
  }
  std::vector<nlohmann::json> step_records() {
    std::vector<nlohmann::json> out;
    std::ifstream in(root_ / "run" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.push_back(j);
    }
    return out;
  }
  fs::path root_;
  std::string prefix_;
};

TEST_F(MfuPeakRun, BadValuesNameTheKey) {
  const std::string bad = test::error_of([&] { config({"train.mfu_peak=\"h800\""}); });
  EXPECT_NE(bad.find("train.mfu_peak"), std::string::npos) << bad;
  EXPECT_NE(bad.find("h100"), std::string::npos) << bad;  // lists the choices
  const std::string negative = test::error_of([&] { config({"train.mfu_peak_flops=-1"}); });
  EXPECT_NE(negative.find("train.mfu_peak_flops"), std::string::npos) << negative;
  // The peak changes what the records say, not what the run computes: a resume may change it.
  EXPECT_TRUE(config_change_is_safe("train.mfu_peak"));
  EXPECT_TRUE(config_change_is_safe("train.mfu_peak_flops"));
  // Any name goes with a stated figure.
  EXPECT_EQ(test::error_of([&] { config({"train.mfu_peak=\"my-box\"", "train.mfu_peak_flops=1e11"}); }), "");
}

TEST_F(MfuPeakRun, RecordsDivideByTheStatedPeak) {
  Trainer(config({"train.mfu_peak_flops=1e11"}), {.quiet = true}).run();
  const auto recs = step_records();
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& r : recs) {
    EXPECT_EQ(r["mfu_peak"], "stated");
    EXPECT_DOUBLE_EQ(r["mfu_peak_tflops"].get<double>(), 0.1);
    // mfu = achieved / peak; both printed with full double precision, so only rounding differs.
    EXPECT_NEAR(r["mfu"].get<double>(), r["tflops"].get<double>() / 0.1, 1e-12 * r["mfu"].get<double>());
  }
}

TEST_F(MfuPeakRun, DefaultIsTheCpuFormulaForEveryStep) {
  Trainer(config({}), {.quiet = true}).run();
  const auto recs = step_records();
  ASSERT_EQ(recs.size(), 3u);
  const double expected = cpu_peak(detect_cpu(num_threads())).flops_per_s / 1e12;
  for (const auto& r : recs) {
    EXPECT_EQ(r["mfu_peak"], "cpu");
    EXPECT_DOUBLE_EQ(r["mfu_peak_tflops"].get<double>(), expected);  // one figure for the whole run
  }
}

}  // namespace
}  // namespace zaya::train
