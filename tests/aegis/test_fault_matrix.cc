// The injected fault matrix through `zaya supervise` with the real `zaya train` on the toy model:
// each class (crash, hang, NaN, slow rank, corrupt checkpoint, kill during a save, a non-zero
// exit) at two steps drawn per test process (seeded and printed: ZAYA_AEGIS_SEED reproduces them),
// at 1 and 2 ranks. The first fault fires on attempt 1 and the second on attempt 2
// (`--inject ...,attempt=N`), so one supervised run meets both. The run must finish, every fault
// must have been seen and recovered, and its final checkpoint's weights must be bitwise those of
// an undisturbed run's (resume is bit-exact, tests/train): any difference means the supervisor
// resumed from the wrong place, lost or repeated data, or let a damaged checkpoint through. A NaN
// is compared with an undisturbed run that skipped the same data windows, the one documented
// difference. A slow rank is a straggler: reported while the run goes on (docs/aegis.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "aegis/train_runs.h"
#include "zaya/aegis/run_state.h"
#include "zaya/ckpt/fs_util.h"

namespace zaya::aegis {
namespace {
namespace fs = std::filesystem;
using namespace zaya::aegis::testing;

constexpr int kSteps = 20, kEvery = 3;  // checkpoints at 3, 6, ..., 18 and the final 20

class FaultMatrix : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_aegis_matrix_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    corpus_ = train::toy::make_corpus(root_ / "data");
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    rng_.seed(fault_seed() ^ std::hash<std::string>{}(std::string(info->test_suite_name()) + "." + info->name()));
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }
  int np() const { return GetParam(); }

  fs::path write_config(const std::string& name, const std::string& extra = "") {
    const fs::path cfg = root_ / (name + ".toml");
    std::ofstream(cfg) << toy_run_config(corpus_, root_ / name, np(), kSteps, kEvery, extra);
    return cfg;
  }
  // The undisturbed run's final weights, shared by every test at this world size.
  std::vector<float> reference() { return undisturbed_weights(np(), kSteps, kEvery); }
  // Two distinct steps a < b drawn from [lo, hi], printed.
  std::pair<int, int> two_steps(int lo, int hi, int stride = 1) {
    std::vector<int> s;
    for (int x = lo; x <= hi; x += stride) s.push_back(x);
    std::shuffle(s.begin(), s.end(), rng_);
    std::pair<int, int> p{std::min(s[0], s[1]), std::max(s[0], s[1])};
    std::cout << "fault steps " << p.first << " and " << p.second << std::endl;
    return p;
  }
  int draw(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int rank() { return draw(0, np() - 1); }

  // Supervises the run `name` with `injects` (each `--inject X`) and returns the supervisor's output.
  test::CliRun supervise(const std::string& name, const std::vector<std::string>& injects,
                         const std::string& options = "") {
    const fs::path cfg = write_config(name);
    std::string cmd = kEnv + ZAYA_BINARY +
                      " supervise --backoff 0.05 --backoff-max 0.2 --progress-every 0 --quiet-job --exit-grace 3 " +
                      options + " -- " + train_command(cfg, np());
    for (const std::string& i : injects) cmd += " --inject " + i;
    return test::run_shell(cmd);
  }
  // The supervisor's output and every attempt's log, for failure messages.
  std::string logs(const std::string& name, const test::CliRun& r) const {
    std::string all = r.output;
    for (int n = 1; n <= 6; ++n) {
      const fs::path l = aegis_dir(root_ / name) / ("attempt_" + std::to_string(n) + ".log");
      if (fs::exists(l)) all += "\n--- attempt " + std::to_string(n) + "\n" + test::run_shell("tail -20 " + l.string()).output;
    }
    return all;
  }
  // The run finished; the incidents are of the classes `allowed`, `expected` many, each recovered.
  std::vector<Incident> expect_recovered(const std::string& name, const test::CliRun& r, size_t expected,
                                         const std::set<std::string>& allowed) {
    EXPECT_EQ(r.code, 0) << logs(name, r);
    const std::vector<Incident> inc = read_incidents(root_ / name);
    EXPECT_EQ(inc.size(), expected) << logs(name, r);
    for (const Incident& i : inc) {
      EXPECT_TRUE(allowed.count(i.cls)) << i.cls << ": " << i.evidence;
      if (i.cls != "straggler") {
        EXPECT_TRUE(i.time_to_recover_s.has_value()) << i.cls << " never recovered";
      }
    }
    EXPECT_EQ(load_state(root_ / name).status, "finished");
    return inc;
  }
  void expect_reference_weights(const std::string& name, const std::vector<float>& ref) {
    ASSERT_FALSE(ref.empty());
    EXPECT_TRUE(final_weights(root_ / name) == ref) << "final weights differ in some bit from the undisturbed run's";
  }

  fs::path root_;
  std::string corpus_;
  std::mt19937_64 rng_;
};

TEST_P(FaultMatrix, CrashKillNine) {
  const auto [a, b] = two_steps(2, kSteps - 2);
  const int r = rank();
  const test::CliRun run = supervise(
      "kill", {"kill@step=" + std::to_string(a) + ",rank=" + std::to_string(r) + ",attempt=1",
               "kill@step=" + std::to_string(b) + ",rank=" + std::to_string(r) + ",attempt=2"});
  const auto inc = expect_recovered("kill", run, 2, {"crash", "collective-timeout"});
  for (const Incident& i : inc) EXPECT_NE(i.evidence.find("SIGKILL"), std::string::npos) << i.evidence;
  expect_reference_weights("kill", reference());
}

TEST_P(FaultMatrix, NonZeroExit) {
  const auto [a, b] = two_steps(2, kSteps - 2);
  const int codes[] = {1, 7, 42, 100};  // never 2 (a configuration error, not retried) nor 3..5 (their own classes)
  const int c1 = codes[draw(0, 3)], c2 = codes[draw(0, 3)], r = rank();
  const test::CliRun run =
      supervise("exit", {str("exit@step=", a, ",code=", c1, ",rank=", r, ",attempt=1"),
                         str("exit@step=", b, ",code=", c2, ",rank=", r, ",attempt=2")});
  const auto inc = expect_recovered("exit", run, 2, {"crash", "collective-timeout"});
  if (inc.size() == 2 && np() == 1) {
    EXPECT_NE(inc[0].evidence.find(str("exit code ", c1)), std::string::npos) << inc[0].evidence;
    EXPECT_NE(inc[1].evidence.find(str("exit code ", c2)), std::string::npos) << inc[1].evidence;
  }
  expect_reference_weights("exit", reference());
}

// A hang is seen by its heartbeat standing still (--hang-timeout 3 here, learned from the step
// times by default; start-up and saves get the phase floor, 30 s, as a loaded machine needs); the
// hung process is killed with its whole session.
TEST_P(FaultMatrix, Hang) {
  const auto [a, b] = two_steps(2, kSteps - 2);
  const int r = rank();
  const test::CliRun run =
      supervise("hang", {str("hang@step=", a, ",rank=", r, ",attempt=1"), str("hang@step=", b, ",rank=", r, ",attempt=2")},
                "--hang-timeout 3 --hang-phase-floor 30");
  const auto inc = expect_recovered("hang", run, 2, {"hang", "collective-timeout"});
  for (const Incident& i : inc)
    if (i.cls == "hang") {
      EXPECT_LE(i.time_to_detect_s, 3 + 2.0) << "the timeout + polling on a loaded machine";
    }
  expect_reference_weights("hang", reference());
}

// A NaN stops its step (max_skipped_steps = 1: exit 4); the supervisor rewinds one checkpoint
// further and skips the data window; the result is an undisturbed run with the same windows skipped.
// The steps come after the first checkpoint: the window is computed from the loader positions that
// checkpoints record, and before the first there is none (the restart then starts over without a
// window, as docs/aegis.md says).
TEST_P(FaultMatrix, NanRewindsAndSkipsTheWindow) {
  const auto [a, b] = two_steps(kEvery + 1, kSteps - 2);
  const int r = rank();
  const test::CliRun run =
      supervise("nan", {str("nan@step=", a, ",rank=", r, ",attempt=1"), str("nan@step=", b, ",rank=", r, ",attempt=2")});
  const auto inc = expect_recovered("nan", run, 2, {"nonfinite"});
  const SupervisorState st = load_state(root_ / "nan");
  ASSERT_GE(st.skip_windows.size(), 1u) << logs("nan", run);
  // The first NaN's step a read samples [2(a-1), 2a) (2 a step, nothing skipped before it).
  EXPECT_LE(st.skip_windows[0].begin, 2 * (a - 1));
  EXPECT_GE(st.skip_windows[0].end, 2 * a);
  std::string skips;
  for (const SkipWindow& w : st.skip_windows) skips += " --skip-samples " + w.arg();
  const fs::path cfg = write_config("nan_ref");
  const test::CliRun ref = test::run_shell(kEnv + train_command(cfg, np()) + skips);
  ASSERT_EQ(ref.code, 0) << ref.output;
  expect_reference_weights("nan", final_weights(root_ / "nan_ref"));
}

// The checkpoint of step c is damaged after its commit and the job killed before the next one: the
// restart skips c (kept, moved aside by zaya train) and resumes from the one before.
TEST_P(FaultMatrix, CorruptCheckpoint) {
  const auto [c1, c2] = two_steps(2 * kEvery, kSteps - kEvery + 1, kEvery);
  const int k1 = draw(1, kEvery - 1), k2 = draw(1, kEvery - 1), f1 = rank(), f2 = rank();
  const test::CliRun run = supervise(
      "corrupt", {str("corrupt-ckpt@step=", c1, ",rank=", f1, ",attempt=1"), str("kill@step=", c1 + k1, ",attempt=1"),
                  str("corrupt-ckpt@step=", c2, ",rank=", f2, ",attempt=2"), str("kill@step=", c2 + k2, ",attempt=2")});
  const auto inc = expect_recovered("corrupt", run, 4, {"crash", "collective-timeout", "corrupt-checkpoint"});
  std::vector<int64_t> rejected;
  for (const Incident& i : inc)
    if (i.cls == "corrupt-checkpoint") {
      rejected.push_back(i.failed_step);
      EXPECT_EQ(i.resume_step, i.failed_step - kEvery) << i.evidence;
    }
  EXPECT_EQ(rejected, (std::vector<int64_t>{c1, c2})) << logs("corrupt", run);
  int kept = 0;  // moved aside, never deleted
  for (const auto& e : fs::directory_iterator(root_ / "corrupt"))
    if (e.path().filename().string().rfind("rewound-", 0) == 0)
      for (int c : {c1, c2}) kept += fs::exists(e.path() / ckpt::step_dir_name(c));
  EXPECT_EQ(kept, 2);
  expect_reference_weights("corrupt", reference());
}

// SIGKILL while the checkpoint of step c is written (its rank file is out, the commit is not): the
// previous checkpoint is the newest valid one, and the restart continues from it.
TEST_P(FaultMatrix, KillDuringSave) {
  const auto [c1, c2] = two_steps(2 * kEvery, kSteps - 2, kEvery);
  const int r = rank();
  const test::CliRun run = supervise("save", {str("kill-during-save@step=", c1, ",rank=", r, ",attempt=1"),
                                              str("kill-during-save@step=", c2, ",rank=", r, ",attempt=2")});
  const auto inc = expect_recovered("save", run, 2, {"crash", "collective-timeout"});
  if (inc.size() == 2) {
    EXPECT_EQ(inc[0].resume_step, c1 - kEvery);
    EXPECT_EQ(inc[1].resume_step, c2 - kEvery);
  }
  expect_reference_weights("save", reference());
}

INSTANTIATE_TEST_SUITE_P(Ranks, FaultMatrix, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "rank"; });

// A slow rank (two ranks only: slowness is relative to the others) from a drawn step on: the
// supervisor reports it as a straggler from the ranks' own step times (busy_time: in synchronous
// data parallelism every rank's whole step lasts as long as the slowest's) and lets the run go on;
// the weights are unchanged. Restarting without the slow host is --exclude-stragglers with
// --hosts (test_supervise_records.cc).
class SlowRank : public FaultMatrix {};

TEST_P(SlowRank, IsReportedAsAStragglerAndTheRunGoesOn) {
  const int onset = draw(2, 6), r = rank();
  std::cout << "slow from step " << onset << " on rank " << r << std::endl;
  const test::CliRun run = supervise("slow", {str("slow@rank=", r, ",factor=60,step=", onset)}, "--straggler-steps 3");
  const auto inc = expect_recovered("slow", run, 1, {"straggler"});
  if (inc.size() == 1) {
    EXPECT_EQ(inc[0].rank, r) << inc[0].evidence;
    EXPECT_GE(inc[0].failed_step, onset) << inc[0].evidence;
    EXPECT_NE(inc[0].action.find("none (reported"), std::string::npos) << inc[0].action;
  }
  EXPECT_EQ(load_state(root_ / "slow").attempts, 1);
  expect_reference_weights("slow", reference());
}

INSTANTIATE_TEST_SUITE_P(Ranks, SlowRank, ::testing::Values(2),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "rank"; });

}  // namespace
}  // namespace zaya::aegis
