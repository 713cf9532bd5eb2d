// `zaya supervise` over the real `zaya train` on the toy model at 1 and 2 ranks: faults from
// outside (kill -9 of one rank's process, SIGSTOP of one rank) and a corrupt newest checkpoint.
// The supervised run finishes and its final checkpoint's weights are bitwise identical to an
// undisturbed run's: resume is bit-exact (tests/train), so any difference is a supervisor that
// resumed from the wrong place, skipped or repeated data, or let a damaged checkpoint through.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/aegis/recovery.h"
#include "zaya/aegis/run_state.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/model/params.h"

namespace zaya::aegis {
namespace {
namespace fs = std::filesystem;

const std::string kEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE ";

// Every weight of the run's final checkpoint, in weight_shapes order.
std::vector<float> final_weights(const fs::path& run) {
  ckpt::Checkpoint c(run);
  std::vector<float> all;
  const auto cfg = model::ModelConfig::from_hf_json_text(c.manifest().state["model_config"].dump(), "");
  for (const auto& [name, shape] : model::weight_shapes(cfg)) {
    const Tensor t = c.load_full(name);
    all.insert(all.end(), t.data<float>(), t.data<float>() + t.numel());
  }
  return all;
}

class SuperviseTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_aegis_train_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    prefix_ = train::toy::make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }

  // A toy run of `steps` steps, a checkpoint every `every`, global batch 2 sequences at np ranks.
  fs::path config(const std::string& name, int np, int steps, int every) {
    const fs::path cfg = root_ / (name + ".toml");
    std::ofstream(cfg) << train::toy::model_section() << "[data]\ntrain = [\"" << prefix_ << "\"]\n"
                       << "[train]\nsteps = " << steps << "\nmicro_batch = 1\nseq_len = 16\ngrad_accum = " << 2 / np
                       << "\neval_every = 0\nprogress = false\nout_dir = \"" << (root_ / name).string() << "\"\n"
                       << "[optim]\nlr = 3e-3\nwarmup_steps = 5\ntotal_steps = 1000\nbalance_lr = 1e-3\n"
                       << "[ckpt]\nevery = " << every << "\nkeep_last = 3\nsave_final = true\n"
                       << "[parallel]\ntimeout_s = 4\n";
    return cfg;
  }
  std::string train_command(const fs::path& cfg, int np) const {
    return (np == 1 ? std::string() : "mpirun --oversubscribe -np " + std::to_string(np) + " ") + ZAYA_BINARY +
           " --threads 1 train --config " + cfg.string();
  }
  // An undisturbed run's final weights.
  std::vector<float> reference(int np, int steps, int every) {
    const fs::path cfg = config("ref" + std::to_string(np), np, steps, every);
    const test::CliRun r = test::run_shell(kEnv + train_command(cfg, np));
    EXPECT_EQ(r.code, 0) << r.output;
    return final_weights(root_ / ("ref" + std::to_string(np)));
  }
  // Supervises a run and, once its first checkpoint exists, sends `signal` to the process of rank
  // `rank` (found by OMPI_COMM_WORLD_RANK under mpirun; the one `zaya train` process at np 1).
  test::CliRun supervise_and_hurt(const std::string& name, int np, int steps, int every, const std::string& signal,
                                  const std::string& options = "") {
    const fs::path cfg = config(name, np, steps, every), out = root_ / name, log = root_ / (name + ".log");
    const std::string pick =
        np == 1 ? "grep -qa supervise /proc/$p/cmdline || victim=$p"
                : "tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p";
    const std::string script =
        "(" + kEnv + ZAYA_BINARY + " supervise --backoff 0.1 --progress-every 0 --quiet-job " + options + " -- " +
        train_command(cfg, np) + " > " + log.string() + " 2>&1; echo rc=$? >> " + log.string() + ") &\n"
        "for i in $(seq 1200); do [ -e " + (out / "latest").string() + " ] && break; sleep 0.05; done\n"
        "victim=''; for p in $(pgrep -f -- 'train --config " + cfg.string() + "'); do\n  " + pick + "; done\n"
        "echo victim=$victim\n"
        "[ -n \"$victim\" ] && kill -" + signal + " $victim\n"
        "wait\n"
        "cat " + log.string() + "\n";
    return test::run_shell(script);
  }
  static bool has_heartbeats(const fs::path& run) { return fs::exists(run / "heartbeat"); }

  fs::path root_;
  std::string prefix_;
};

TEST_F(SuperviseTrain, PlanSkipsACorruptNewestCheckpointAndComputesTheSkipWindow) {
  const fs::path cfg = config("plan", 1, 15, 5);
  const test::CliRun r = test::run_shell(kEnv + train_command(cfg, 1));
  ASSERT_EQ(r.code, 0) << r.output;
  const fs::path run = root_ / "plan";
  ASSERT_EQ(ckpt::list_steps(run), (std::vector<int64_t>{5, 10, 15}));
  const auto next = [&](int64_t step) {
    return ckpt::Checkpoint(run / ckpt::step_dir_name(step)).manifest().state["data_loader_next_sample"].get<int64_t>();
  };
  ASSERT_EQ(next(10) - next(5), 5 * 2);  // 2 sequences a step

  RestartPlan p = plan_restart(run, false, -1);
  EXPECT_EQ(p.resume_step, 15);
  EXPECT_FALSE(p.rewind);
  EXPECT_FALSE(p.skip);
  // A NaN reported at step 17: back to step 10 and skip the samples of steps 11 .. 18.
  p = plan_restart(run, true, 17);
  EXPECT_EQ(p.resume_step, 10);
  EXPECT_TRUE(p.rewind);
  ASSERT_TRUE(p.skip);
  EXPECT_EQ(*p.skip, (SkipWindow{next(10), next(10) + 8 * 2}));

  // Step 15 damaged (one byte of a tensor file flipped): skipped, reported, kept.
  fs::path victim;
  for (const auto& e : fs::directory_iterator(run / ckpt::step_dir_name(15)))
    if (e.path().extension() == ".safetensors") victim = e.path();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-8, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-8, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  p = plan_restart(run, false, -1);
  EXPECT_EQ(p.resume_step, 10);
  EXPECT_TRUE(p.rewind);
  ASSERT_EQ(p.rejected.size(), 1u);
  EXPECT_EQ(p.rejected[0].step, 15);
  EXPECT_FALSE(p.rejected[0].problem.empty());
  // NaN after a corrupt newest: one verifying checkpoint further back than the newest that verifies.
  EXPECT_EQ(plan_restart(run, true, 16).resume_step, 5);
}

TEST_F(SuperviseTrain, ACorruptNewestCheckpointIsSkippedKeptAndTheRunEndsAsAnUndisturbedOne) {
  const int steps = 20, every = 5;
  const std::vector<float> ref = reference(1, steps, every);
  // A first run stops at step 15 (its config says 15); its step 15 is then damaged.
  const fs::path cfg = config("corrupt", 1, steps, every);
  ASSERT_EQ(test::run_shell(kEnv + train_command(cfg, 1) + " --set train.steps=15").code, 0);
  const fs::path run = root_ / "corrupt";
  // The damage: step 15's manifest names a file size that is not there (a torn write).
  const fs::path st = run / ckpt::step_dir_name(15);
  for (const auto& e : fs::directory_iterator(st))
    if (e.path().extension() == ".safetensors") fs::resize_file(e.path(), fs::file_size(e.path()) - 4);
  const test::CliRun r = test::run_shell(kEnv + ZAYA_BINARY + " supervise --progress-every 0 --quiet-job -- " +
                                         train_command(cfg, 1));
  ASSERT_EQ(r.code, 0) << r.output << test::run_shell("cat " + (aegis_dir(run) / "attempt_1.log").string()).output;
  const auto inc = read_incidents(run);
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "corrupt-checkpoint");
  EXPECT_EQ(inc[0].failed_step, 15);
  EXPECT_EQ(inc[0].resume_step, 10);
  // Kept: zaya train moved it aside, nothing deleted.
  bool kept = false;
  for (const auto& e : fs::directory_iterator(run))
    kept |= e.path().filename().string().rfind("rewound-", 0) == 0 && fs::exists(e.path() / ckpt::step_dir_name(15));
  EXPECT_TRUE(kept);
  EXPECT_TRUE(final_weights(run) == ref) << "final weights differ in some bit from the undisturbed run's";
}

TEST_F(SuperviseTrain, KillNineOfTheOnlyRankIsRecoveredBitExactly) {
  const int steps = 400, every = 10;
  const std::vector<float> ref = reference(1, steps, every);
  const test::CliRun r = supervise_and_hurt("kill1", 1, steps, every, "KILL");
  ASSERT_EQ(r.output.find("victim=\n"), std::string::npos) << r.output;
  ASSERT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  const auto inc = read_incidents(root_ / "kill1");
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "crash");
  EXPECT_NE(inc[0].evidence.find("SIGKILL"), std::string::npos) << inc[0].evidence;
  EXPECT_NE(inc[0].action.find("restart from step_"), std::string::npos) << inc[0].action;
  EXPECT_TRUE(final_weights(root_ / "kill1") == ref) << "final weights differ in some bit from the undisturbed run's";
}

TEST_F(SuperviseTrain, KillNineOfOneOfTwoRanksIsRecoveredBitExactly) {
  const int steps = 300, every = 10;
  const std::vector<float> ref = reference(2, steps, every);
  const test::CliRun r = supervise_and_hurt("kill2", 2, steps, every, "KILL");
  ASSERT_EQ(r.output.find("victim=\n"), std::string::npos) << r.output;
  ASSERT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  const auto inc = read_incidents(root_ / "kill2");
  ASSERT_GE(inc.size(), 1u) << r.output;
  EXPECT_TRUE(inc[0].cls == "crash" || inc[0].cls == "collective-timeout") << inc[0].cls;
  EXPECT_TRUE(final_weights(root_ / "kill2") == ref) << "final weights differ in some bit from the undisturbed run's";
}

// SIGSTOP of rank 1 of 2: rank 0's collective times out (parallel.timeout_s = 4) naming it, or, with
// heartbeats, the supervisor sees rank 1 stop making progress first. Either way the stopped process
// is killed with the rest and the run resumes.
TEST_F(SuperviseTrain, SigstopOfOneOfTwoRanksIsRecoveredBitExactly) {
  const int steps = 300, every = 10;
  const std::vector<float> ref = reference(2, steps, every);
  const test::CliRun r = supervise_and_hurt("stop2", 2, steps, every, "STOP", "--hang-timeout 3 --exit-grace 3");
  ASSERT_EQ(r.output.find("victim=\n"), std::string::npos) << r.output;
  ASSERT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  const auto inc = read_incidents(root_ / "stop2");
  ASSERT_GE(inc.size(), 1u) << r.output;
  EXPECT_TRUE(inc[0].cls == "collective-timeout" || inc[0].cls == "hang") << inc[0].cls << ": " << inc[0].evidence;
  EXPECT_EQ(inc[0].rank, 1) << inc[0].evidence;
  EXPECT_TRUE(final_weights(root_ / "stop2") == ref) << "final weights differ in some bit from the undisturbed run's";
}

// SIGSTOP of the only rank: no collective notices, so only heartbeats can. Skipped (saying so)
// while `zaya train` writes none (the trainer's half of the Aegis contract).
TEST_F(SuperviseTrain, SigstopOfTheOnlyRankIsAHangRecoveredBitExactly) {
  const fs::path probe = config("probe", 1, 2, 0);
  const test::CliRun pr = test::run_shell(kEnv + train_command(probe, 1));
  ASSERT_EQ(pr.code, 0) << pr.output;
  if (!has_heartbeats(root_ / "probe"))
    GTEST_SKIP() << "zaya train writes no heartbeats (" << (root_ / "probe/heartbeat").string()
                 << " absent): hang detection of a single rank needs the trainer's half of the Aegis contract";
  const int steps = 400, every = 10;
  const std::vector<float> ref = reference(1, steps, every);
  const test::CliRun r = supervise_and_hurt("stop1", 1, steps, every, "STOP", "--hang-timeout 2 --hang-phase-floor 5");
  ASSERT_EQ(r.output.find("victim=\n"), std::string::npos) << r.output;
  ASSERT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  const auto inc = read_incidents(root_ / "stop1");
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "hang");
  EXPECT_LE(inc[0].time_to_detect_s, 5 + 1.0);  // the phase floor (a save may be under way) + polling
  EXPECT_TRUE(final_weights(root_ / "stop1") == ref) << "final weights differ in some bit from the undisturbed run's";
}

// A NaN (the fake contract job's exit 4) in a run with real checkpoints: the restart goes one
// verifying checkpoint further back than the newest, with --rewind and the offending window as
// --skip-samples; the window is in state.json and on every later launch, through a crash.
TEST_F(SuperviseTrain, ANanRewindsOneCheckpointFurtherAndKeepsSkippingItsWindow) {
  const fs::path cfg = config("nan", 1, 15, 5);
  ASSERT_EQ(test::run_shell(kEnv + train_command(cfg, 1)).code, 0);
  const fs::path run = root_ / "nan";
  const int64_t n10 =
      ckpt::Checkpoint(run / ckpt::step_dir_name(10)).manifest().state["data_loader_next_sample"].get<int64_t>();
  const test::CliRun r = test::run_shell(std::string(ZAYA_BINARY) + " supervise --run-dir " + run.string() +
                                         " --backoff 0.05 --progress-every 0 -- bash " + ZAYA_SOURCE_DIR +
                                         "/tests/aegis/fake_job.sh " + run.string() + " 20 ok,nan@17,crash@3,ok");
  ASSERT_EQ(r.code, 0) << r.output;  // attempt 1 is `ok`: the run's first launch continues from step 15
  const std::string window = std::to_string(n10) + ":" + std::to_string(n10 + (18 - 10) * 2);
  const test::CliRun r2 = test::run_shell("cat " + (aegis_dir(run) / "attempt_1.log").string());
  EXPECT_NE(r2.output.find("args: --resume " + (run / "step_0000015").string() + "\n"), std::string::npos) << r2.output;
  // A second supervisor run (attempts 2..4): NaN at 17, then a crash, then done.
  const test::CliRun s = test::run_shell(std::string(ZAYA_BINARY) + " supervise --run-dir " + run.string() +
                                         " --backoff 0.05 --progress-every 0 -- bash " + ZAYA_SOURCE_DIR +
                                         "/tests/aegis/fake_job.sh " + run.string() + " 20 ok,nan@17,crash@3,ok");
  ASSERT_EQ(s.code, 0) << s.output;
  const auto log = [&](int n) {
    return test::run_shell("cat " + (aegis_dir(run) / ("attempt_" + std::to_string(n) + ".log")).string()).output;
  };
  EXPECT_NE(log(3).find("args: --resume " + (run / "step_0000010").string() + " --rewind --skip-samples " + window),
            std::string::npos)
      << log(3);
  EXPECT_NE(log(4).find("--skip-samples " + window), std::string::npos) << log(4);
  const SupervisorState st = load_state(run);
  ASSERT_EQ(st.skip_windows.size(), 1u);
  EXPECT_EQ(st.skip_windows[0].arg(), window);
  const auto inc = read_incidents(run);
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].cls, "nonfinite");
  EXPECT_EQ(inc[0].resume_step, 10);
  EXPECT_NE(inc[0].action.find("skipping samples " + window), std::string::npos) << inc[0].action;
}

}  // namespace
}  // namespace zaya::aegis
