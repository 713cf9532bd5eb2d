// A run is never lost or corrupted silently (issue 35): import-hf never hijacks a run directory,
// non-finite weights are refused on import and load, a run whose updates are all skipped stops,
// a resume with a changed config says what changed, and write failures are reported at once.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/train/model_io.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

using test::CliRun;
using test::error_of;
using test::run_zaya;
using toy::make_corpus;
using toy::toy_config;

class IntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_integrity_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    prefix_ = make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }
  RunConfig config(const std::string& run, int steps, std::vector<std::string> overrides = {}) {
    return parse_run_config(toy_config(prefix_, root_ / run, steps), "toy.toml", std::move(overrides));
  }
  // A trained toy run exported as a transformers directory `hf` (fp32).
  fs::path exported_hf(const std::string& run) {
    Trainer t(config(run, 6), {.quiet = true});
    t.run();
    const fs::path hf = root_ / (run + "_hf");
    CliRun r = run_zaya("--log-level warn ckpt export-hf " + (root_ / run).string() + " --out " + hf.string());
    EXPECT_EQ(r.code, 0) << r.output;
    return hf;
  }
  fs::path root_;
  std::string prefix_;
};

// Overwrites element `index` of tensor `name` in a safetensors file (F32) with `value`.
void poke_f32(const fs::path& file, const std::string& name, int64_t index, float value) {
  uint64_t offset = 0;
  {
    ckpt::SafetensorsFile f(file);
    const ckpt::StTensorInfo* info = f.header().find(name);
    ASSERT_NE(info, nullptr) << name;
    ASSERT_EQ(info->dtype, "F32");
    offset = f.header().data_start + info->begin + static_cast<uint64_t>(index) * 4;
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(reinterpret_cast<const char*>(&value), 4);
  ASSERT_TRUE(io.good());
}

// Finding 8: `ckpt import-hf HF --out RUN` into a run directory that holds a run used to repoint
// its `latest` at the import. It is refused, naming the directory, and the run is untouched.
TEST_F(IntegrityTest, ImportHfRefusesANonEmptyRunDirectory) {
  const fs::path hf = exported_hf("run");
  const fs::path run = root_ / "run";
  const auto latest_before = ckpt::read_latest(run);
  ASSERT_TRUE(latest_before.has_value());
  CliRun r = run_zaya("--log-level warn ckpt import-hf " + hf.string() + " --out " + run.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(run.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not empty"), std::string::npos) << r.output;
  EXPECT_EQ(ckpt::read_latest(run), latest_before);
  EXPECT_TRUE(ckpt::Checkpoint(run).verify().ok());
  // A new directory and an existing empty one are fine.
  fs::create_directories(root_ / "empty");
  for (const char* out : {"fresh", "empty"}) {
    CliRun ok = run_zaya("--log-level warn ckpt import-hf " + hf.string() + " --out " + (root_ / out).string());
    EXPECT_EQ(ok.code, 0) << out << ": " << ok.output;
  }
}

}  // namespace
}  // namespace zaya::train
