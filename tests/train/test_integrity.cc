// A run is never lost or corrupted silently (issue 35): import-hf never hijacks a run directory,
// non-finite weights are refused on import and load, a run whose updates are all skipped stops,
// a resume with a changed config says what changed, and write failures are reported at once.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/train/config_change.h"
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
    CliRun r =
        run_zaya("--log-level warn ckpt export-hf " + (root_ / run).string() + " --out " + hf.string());
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
    CliRun ok =
        run_zaya("--log-level warn ckpt import-hf " + hf.string() + " --out " + (root_ / out).string());
    EXPECT_EQ(ok.code, 0) << out << ": " << ok.output;
  }
}

// Finding 10: non-finite weights are refused where they enter: import-hf (a transformers
// directory, naming the tensor and file), and a load of a zaya checkpoint that holds them (its
// checksums match: they were written that way), as the start of a run or the model of a command.
TEST_F(IntegrityTest, NonFiniteWeightsAreRefusedOnImportAndLoad) {
  const fs::path hf = exported_hf("run");
  const std::string bad = "model.layers.1.self_attn.o_proj.weight";
  poke_f32(hf / "model.safetensors", bad, 3, std::numeric_limits<float>::quiet_NaN());
  CliRun r =
      run_zaya("--log-level warn ckpt import-hf " + hf.string() + " --out " + (root_ / "imported").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ / "imported" / "latest"));
  r = run_zaya("--log-level warn forward --model " + hf.string() + " --ids 3,4,5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;

  // A checkpoint written with an infinite weight (save_weights_checkpoint stores what it is given).
  LoadedModel m = load_model_source((root_ / "run").string(), 1, 1);
  m.model->param(m.model->param_index(bad)).data<float>()[5] = std::numeric_limits<float>::infinity();
  const fs::path saved = save_weights_checkpoint(*m.model, root_ / "inf");
  ASSERT_TRUE(ckpt::Checkpoint(saved).verify().ok());
  const std::string load = error_of([&] { load_model_source(saved.string(), 1, 1); });
  EXPECT_NE(load.find(bad), std::string::npos) << load;
  EXPECT_NE(load.find("non-finite"), std::string::npos) << load;
  RunConfig c = config("from_inf", 6);
  c.train.init_from = saved.string();
  const std::string init = error_of([&] { Trainer t(c, {.quiet = true}); });
  EXPECT_NE(init.find(bad), std::string::npos) << init;
}

// Finding 10: a run whose updates are all skipped (non-finite gradients: here NaN weights planted
// after a resume) stops after train.max_skipped_steps of them in a row with an error naming the
// step and the gradient norm, and saves nothing over the last good checkpoint (ckpt.every = 1
// would otherwise save every skipped step).
TEST_F(IntegrityTest, ConsecutiveSkippedUpdatesStopTheRun) {
  const std::vector<std::string> set = {"ckpt.every=1", "train.max_skipped_steps=3"};
  {
    Trainer first(config("run", 20, set), {.quiet = true, .stop_after_steps = 6});
    ASSERT_TRUE(first.run().interrupted);
  }
  {  // one trainer at a time holds the run directory's lock
    Trainer t(config("run", 20, set), {.resume = "latest", .quiet = true});
    Tensor p = t.model().param(3);
    p.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    const std::string e = error_of([&] { t.run(); });
    EXPECT_NE(e.find("step 9"), std::string::npos) << e;
    EXPECT_NE(e.find("3 updates in a row"), std::string::npos) << e;
    EXPECT_NE(e.find("gradient norm nan"), std::string::npos) << e;
    EXPECT_NE(e.find("train.max_skipped_steps"), std::string::npos) << e;
  }
  EXPECT_EQ(ckpt::list_steps(root_ / "run").back(), 6);
  EXPECT_EQ(ckpt::read_latest(root_ / "run")->filename(), "step_0000006");
  // A streak shorter than the limit is survived: the same run with a limit of 50 ends (all 14
  // remaining updates skipped, 14 < 50) without saving a step after 6, the final save included.
  Trainer lenient(config("run", 20, {"ckpt.every=1", "train.max_skipped_steps=50"}),
                  {.resume = "latest", .quiet = true});
  lenient.model().param(3).data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  TrainResult r = lenient.run();
  EXPECT_EQ(r.last_step, 20);
  EXPECT_EQ(ckpt::list_steps(root_ / "run").back(), 6);
  // The option must be positive.
  const std::string zero = error_of([&] { config("x", 5, {"train.max_skipped_steps=0"}); });
  EXPECT_NE(zero.find("train.max_skipped_steps"), std::string::npos) << zero;
}

// The steps of metrics.jsonl's training records (those with a loss), failing on a line that is not
// a whole JSON object.
std::vector<int64_t> train_record_steps(const fs::path& file) {
  std::ifstream in(file);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(j.is_object()) << "not a whole record: " << line;
    if (j.is_object() && j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
  }
  return steps;
}

// Finding 7: a run killed after writing step 8's metrics (the last of them torn) but before its
// checkpoint resumes from step 5 and replays steps 6-8; the file ends with each step once.
TEST_F(IntegrityTest, AResumedRunWritesEachStepOnce) {
  const fs::path run = root_ / "run";
  {
    Trainer first(config("run", 12), {.quiet = true, .stop_after_steps = 8});
    ASSERT_TRUE(first.run().interrupted);
  }
  fs::remove_all(run / ckpt::step_dir_name(8));
  ckpt::write_file_atomic(run / "latest", ckpt::step_dir_name(5) + "\n");
  { std::ofstream(run / "metrics.jsonl", std::ios::app) << R"({"loss":3.1,"step":9,"tok)"; }
  Trainer resumed(config("run", 12), {.resume = "latest", .quiet = true});
  ASSERT_EQ(resumed.run().first_step, 5);
  std::vector<int64_t> want(12);
  for (int i = 0; i < 12; ++i) want[static_cast<size_t>(i)] = i + 1;
  EXPECT_EQ(train_record_steps(run / "metrics.jsonl"), want);
}

// Finding 7: a checkpoint save that fails in the background (here a file-size limit, as a full
// disk: the rank file is larger than the limit, the metrics file stays below it) stops training at
// the next step boundary with an error naming the save; it used to surface only at the next save
// (step 20 here).
TEST_F(IntegrityTest, AFailedBackgroundSaveStopsTheRunAtOnce) {
  RunConfig c = config("run", 40, {"ckpt.every=10", "ckpt.save_final=false"});
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 64 << 10;
  std::string e;
  {
    Trainer t(c, {.quiet = true});
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    e = error_of([&] { t.run(); });
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(e.find("step_0000010"), std::string::npos) << e;
  EXPECT_NE(e.find("File too large"), std::string::npos) << e;
  EXPECT_NE(e.find("failed in the background"), std::string::npos) << e;
  const std::vector<int64_t> steps = train_record_steps(root_ / "run" / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  // The background write fails within milliseconds of step 10; 9 steps of margin for a loaded machine.
  EXPECT_LT(steps.back(), 20) << e;
  EXPECT_FALSE(fs::exists(root_ / "run" / "latest"));
}

// Finding 9: a resume with a changed config says what changed; a change of what the run computes
// (sequence length, data seed, learning rate, the schedule's length through train.steps) is refused
// unless allowed, naming each key with both values; logging, evaluation and checkpoint settings
// may change freely.
TEST_F(IntegrityTest, ResumeWithAChangedConfigIsCheckedKeyByKey) {
  {
    Trainer first(config("run", 20), {.quiet = true, .stop_after_steps = 5});
    ASSERT_TRUE(first.run().interrupted);
  }
  auto resume_error = [&](std::vector<std::string> set, bool allow = false) {
    return error_of([&] {
      Trainer t(config("run", 20, std::move(set)),
                {.resume = "latest", .quiet = true, .allow_config_change = allow});
    });
  };
  const std::string seq = resume_error({"train.seq_len=32", "data.seed=99", "optim.lr=1e-3"});
  EXPECT_NE(seq.find("train.seq_len 16 -> 32"), std::string::npos) << seq;
  EXPECT_NE(seq.find("data.seed 1234 -> 99"), std::string::npos) << seq;
  EXPECT_NE(seq.find("optim.lr 0.003 -> 0.001"), std::string::npos) << seq;
  EXPECT_NE(seq.find("--allow-config-change"), std::string::npos) << seq;
  // More steps with the schedule derived from them changes the schedule: refused, naming it.
  const std::string steps =
      error_of([&] { Trainer t(config("run", 30), {.resume = "latest", .quiet = true}); });
  EXPECT_NE(steps.find("optim.total_steps 20 -> 30"), std::string::npos) << steps;
  EXPECT_EQ(steps.find("train.steps 20 -> 30"), std::string::npos) << steps;  // safe by itself
  // Safe changes resume without a word of refusal.
  EXPECT_EQ(resume_error({"train.log_every=3", "ckpt.every=4", "ckpt.keep_last=2", "train.eval_every=7"}),
            "");
  // Allowed on purpose, the run continues with the new value.
  EXPECT_EQ(resume_error({"train.seq_len=32"}, /*allow=*/true), "");
  // The safe list is searched by bisection; a key that is not on it (one added later) is unsafe.
  EXPECT_TRUE(std::is_sorted(safe_config_keys().begin(), safe_config_keys().end()));
  EXPECT_TRUE(config_change_is_safe("ckpt.snapshot"));
  EXPECT_FALSE(config_change_is_safe("train.some_future_key"));
}

}  // namespace
}  // namespace zaya::train
