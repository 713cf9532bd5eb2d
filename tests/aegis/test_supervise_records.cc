// The supervisor's records and its limits with the real `zaya train` on the toy model: a
// supervisor killed mid-run and started again picks the run up from state.json; a fault on every
// attempt ends in a clear summary, a non-zero exit and the last good checkpoint intact; a host
// that fails repeatedly is excluded and the run finishes on the other with a smaller world,
// loading its checkpoint resharded. Final weights are compared bitwise with undisturbed runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "aegis/train_runs.h"
#include "zaya/aegis/run_state.h"
#include "zaya/ckpt/fs_util.h"

namespace zaya::aegis {
namespace {
namespace fs = std::filesystem;
using namespace zaya::aegis::testing;

constexpr int kSteps = 20, kEvery = 3;
const std::string kF64 = "--set parallel.grad_reduce=f64";

class SuperviseRecords : public ::testing::Test {
 public:
  std::string supervisor() const {
    return kEnv + ZAYA_BINARY + " supervise --backoff 0.05 --backoff-max 0.2 --progress-every 0 --quiet-job ";
  }

 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_aegis_records_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    corpus_ = train::toy::make_corpus(root_ / "data");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }
  fs::path write_config(const std::string& name, int np, const std::string& extra = "") {
    const fs::path cfg = root_ / (name + ".toml");
    std::ofstream(cfg) << toy_run_config(corpus_, root_ / name, np, kSteps, kEvery, extra);
    return cfg;
  }
  std::string attempt_log(const std::string& name, int n) const {
    return test::run_shell("cat " + (aegis_dir(root_ / name) / ("attempt_" + std::to_string(n) + ".log")).string())
        .output;
  }

  fs::path root_;
  std::string corpus_;
};

// The supervisor is killed (SIGKILL: no chance to tidy up) once the run's first checkpoint exists,
// while its job runs in a session of its own (the job, whose output went to the dead supervisor,
// soon dies of SIGPIPE; one still running would be ended by the next supervisor, as
// test_supervise_fake.cc checks). A second supervisor on the same run counts on from the first
// one's attempts and resumes from the newest checkpoint that verifies.
TEST_F(SuperviseRecords, AKilledSupervisorIsRestartedAndPicksUpTheRun) {
  const fs::path cfg = write_config("restart", 1), run = root_ / "restart";
  // Slowed (weights unchanged) so that the job is still running when the supervisor dies.
  const std::string cmd = supervisor() + "-- " + train_command(cfg, 1) + " --inject slow@rank=0,factor=30";
  const test::CliRun first = test::run_shell(
      cmd + " > " + (root_ / "first.log").string() + " 2>&1 &\nsup=$!\n"
      "for i in $(seq 1200); do [ -e " + (run / "latest").string() + " ] && break; sleep 0.05; done\n"
      "kill -9 $sup; wait $sup; echo first_rc=$?\n");
  ASSERT_NE(first.output.find("first_rc=137"), std::string::npos) << first.output;
  const SupervisorState mid = load_state(run);
  EXPECT_EQ(mid.attempts, 1);
  EXPECT_GT(mid.job_session, 0) << "the record of the running job's session";
  const test::CliRun second = test::run_shell(cmd);
  ASSERT_EQ(second.code, 0) << second.output << attempt_log("restart", 2);
  EXPECT_NE(second.output.find("picking up the run"), std::string::npos) << second.output;
  const SupervisorState st = load_state(run);
  EXPECT_EQ(st.attempts, 2);
  EXPECT_EQ(st.status, "finished");
  EXPECT_NE(second.output.find("attempt 2: "), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("--resume " + (run / "step_").string()), std::string::npos) << second.output;
  const std::vector<float> ref = undisturbed_weights(1, kSteps, kEvery);
  ASSERT_FALSE(ref.empty());
  EXPECT_TRUE(final_weights(run) == ref) << "final weights differ in some bit from the undisturbed run's";
}

// The same failure on every attempt: the budget of 2 restarts is spent, the supervisor says why,
// which incidents it met and which checkpoint is the last good one, and exits 1. That checkpoint
// is intact and verifies.
TEST_F(SuperviseRecords, AFaultOnEveryAttemptGivesUpWithASummaryAndTheLastGoodCheckpointIntact) {
  const fs::path cfg = write_config("giveup", 1), run = root_ / "giveup";
  const test::CliRun r = test::run_shell(supervisor() + "--max-restarts 2 -- " + train_command(cfg, 1) +
                                         " --inject exit@step=7,code=1,every-attempt=1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("GIVING UP after 3 attempts (2 restarts): gave up: the restart budget (2) is spent"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("incidents: 3 x crash"), std::string::npos) << r.output;
  // Step 3, or 6 when its background write committed before the exit at the end of step 7.
  const std::vector<int64_t> steps = ckpt::list_steps(run);
  ASSERT_FALSE(steps.empty());
  EXPECT_TRUE(steps.back() == 3 || steps.back() == 6) << steps.back();
  const fs::path good = run / ckpt::step_dir_name(steps.back());
  EXPECT_NE(r.output.find("the last good checkpoint is " + good.string() + " (it verifies)"), std::string::npos)
      << r.output;
  EXPECT_TRUE(ckpt::Checkpoint(good).verify().ok());
  const auto inc = read_incidents(run);
  ASSERT_EQ(inc.size(), 3u);
  for (const Incident& i : inc) {
    EXPECT_EQ(i.cls, "crash");
    EXPECT_EQ(i.failed_step, 7);
    EXPECT_NE(i.evidence.find("exit code 1"), std::string::npos) << i.evidence;
  }
  EXPECT_FALSE(inc.back().time_to_recover_s.has_value());
  const SupervisorState st = load_state(run);
  EXPECT_EQ(st.status, "gave-up");
  std::ifstream g(aegis_dir(run) / "goodput.json");
  EXPECT_EQ(nlohmann::json::parse(g)["status"], "gave-up");
}

// Two "hosts" on this machine (tests/aegis/hosts_launch.sh runs one MPMD part per host); every
// rank on node-b is killed at step 8 on every attempt. After two failures blamed on it (mpirun
// names the rank that died; ranks fill hosts by slot) node-b is excluded, and the third attempt
// runs on node-a alone: world 1 with twice the gradient accumulation, the same global batch,
// resuming from step 6 written at world 2. With the f64 gradient reduction the world size does not
// change a bit, so the result is the undisturbed two-rank run's.
// Supervises the run `name` on two "hosts" of this machine (node-a, node-b: one rank each) through
// tests/aegis/hosts_launch.sh, with `inject` given to node-b's rank only, at the f64 gradient
// reduction (the world size then changes no bit).
test::CliRun supervise_on_two_hosts(const SuperviseRecords& t, const fs::path& root, const fs::path& cfg,
                                    const std::string& inject, const std::string& options) {
  const fs::path hosts = root / "hosts.txt";
  std::ofstream(hosts) << "# two names for this machine\nnode-a slots=1\nnode-b slots=1\n";
  return test::run_shell("ZAYA_TEST_FAIL_HOST=node-b ZAYA_TEST_FAIL_INJECT=" + inject + " ZAYA_TEST_GLOBAL_BATCH=2 " +
                         t.supervisor() + "--hosts " + hosts.string() + " " + options + " -- bash " + ZAYA_SOURCE_DIR +
                         "/tests/aegis/hosts_launch.sh {hosts} " + ZAYA_BINARY + " --threads 1 train --config " +
                         cfg.string() + " " + kF64);
}

TEST_F(SuperviseRecords, AHostThatFailsRepeatedlyIsExcludedAndTheRunFinishesOnTheOther) {
  const fs::path cfg = write_config("hosts", 2), run = root_ / "hosts";
  const test::CliRun r = supervise_on_two_hosts(*this, root_, cfg, "kill@step=8,every-attempt=1", "--exclude-after 2");
  ASSERT_EQ(r.code, 0) << r.output << attempt_log("hosts", 3);
  const SupervisorState st = load_state(run);
  EXPECT_EQ(st.excluded_hosts, std::vector<std::string>{"node-b"});
  EXPECT_EQ(st.attempts, 3);
  const auto inc = read_incidents(run);
  ASSERT_EQ(inc.size(), 2u) << r.output;
  for (const Incident& i : inc) {
    EXPECT_EQ(i.host, "node-b") << i.evidence;
    EXPECT_EQ(i.rank, 1) << i.evidence;
    EXPECT_EQ(i.resume_step, 6);
  }
  EXPECT_NE(inc[1].action.find("excluded host node-b after 2 failures"), std::string::npos) << inc[1].action;
  const std::string third = attempt_log("hosts", 3);
  EXPECT_NE(third.find("2 data-parallel ranks wrote the checkpoint, 1 continue it"), std::string::npos)
      << "a smaller world, resharded:\n" << third;
  const std::vector<float> ref = undisturbed_weights(2, kSteps, kEvery, "", kF64);
  ASSERT_FALSE(ref.empty());
  EXPECT_TRUE(final_weights(run) == ref) << "final weights differ in some bit from the undisturbed run's";
}

// --exclude-stragglers: node-b's rank is slowed 60x from step 2 on; once the supervisor sees its
// own time persistently long it excludes node-b at once and restarts on node-a (world 1), from the
// newest checkpoint, resharded. The slowness changes no bit, so neither does the run.
TEST_F(SuperviseRecords, AStragglersHostIsExcludedWhenAskedAndTheRunFinishesOnTheOther) {
  const fs::path cfg = write_config("straggler", 2), run = root_ / "straggler";
  const test::CliRun r =
      supervise_on_two_hosts(*this, root_, cfg, "slow@rank=1,factor=60,step=2", "--exclude-stragglers --straggler-steps 3");
  ASSERT_EQ(r.code, 0) << r.output << attempt_log("straggler", 2);
  const SupervisorState st = load_state(run);
  EXPECT_EQ(st.excluded_hosts, std::vector<std::string>{"node-b"});
  EXPECT_EQ(st.attempts, 2);
  const auto inc = read_incidents(run);
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "straggler");
  EXPECT_EQ(inc[0].rank, 1) << inc[0].evidence;
  EXPECT_EQ(inc[0].host, "node-b");
  EXPECT_NE(inc[0].action.find("excluded host node-b"), std::string::npos) << inc[0].action;
  const std::vector<float> ref = undisturbed_weights(2, kSteps, kEvery, "", kF64);
  ASSERT_FALSE(ref.empty());
  EXPECT_TRUE(final_weights(run) == ref) << "final weights differ in some bit from the undisturbed run's";
}

}  // namespace
}  // namespace zaya::aegis
