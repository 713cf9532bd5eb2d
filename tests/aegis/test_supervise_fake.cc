// `zaya supervise` driving tests/aegis/fake_job.sh, a stand-in that writes contract heartbeats and
// then crashes, hangs, exits 2, reports a non-finite loss, spikes or finishes, one mode per
// attempt: the classification, the kill of a hung job's whole session, the back-off, the give-up
// summary and exit code, the incident log and the supervisor picking up from its state.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "zaya/aegis/run_state.h"

namespace zaya::aegis {
namespace {
namespace fs = std::filesystem;

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

class SuperviseFake : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_aegis_fake_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Supervises the fake job with PLAN over `steps` steps; fast defaults for the timings.
  test::CliRun supervise(const std::string& plan, const std::string& options = "", int steps = 20,
                         const std::string& job_args = "") {
    return test::run_shell(env_ + ZAYA_BINARY + " supervise --run-dir " + run().string() +
                           " --backoff 0.05 --progress-every 0 --hang-timeout 1 " + options + " -- bash " +
                           ZAYA_SOURCE_DIR + "/tests/aegis/fake_job.sh " + run().string() + " " +
                           std::to_string(steps) + " " + plan + " " + job_args);
  }
  fs::path run() const { return root_ / "run"; }
  std::vector<Incident> incidents() const { return read_incidents(run()); }
  SupervisorState state() const { return load_state(run()); }
  std::string attempt_log(int n) const {
    std::ifstream in(aegis_dir(run()) / ("attempt_" + std::to_string(n) + ".log"));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  fs::path root_;
  std::string env_;  // VAR=value words before the command
};

TEST_F(SuperviseFake, ACrashIsRestartedAndTheRunFinishes) {
  const test::CliRun r = supervise("crash@7,ok");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "crash");
  EXPECT_EQ(inc[0].evidence, "exit code 1");
  EXPECT_EQ(inc[0].attempt, 1);
  EXPECT_EQ(inc[0].rank, 0);
  EXPECT_EQ(inc[0].host, hostname());
  EXPECT_GE(inc[0].failed_step, 5);  // heartbeats are sampled: the newest seen before step 7's crash
  EXPECT_LE(inc[0].failed_step, 6);
  EXPECT_EQ(inc[0].steps_lost, inc[0].failed_step);  // no checkpoint: everything again
  ASSERT_TRUE(inc[0].time_to_recover_s);
  EXPECT_GT(*inc[0].time_to_recover_s, 0);
  const SupervisorState s = state();
  EXPECT_EQ(s.attempts, 2);
  EXPECT_EQ(s.restarts, 1);
  EXPECT_EQ(s.status, "finished");
  EXPECT_EQ(s.high_water_step, 20);
  // Each attempt got its number and its own log.
  EXPECT_NE(attempt_log(1).find("fake_job attempt=1 mode=crash@7"), std::string::npos);
  EXPECT_NE(attempt_log(2).find("fake_job attempt=2 mode=ok"), std::string::npos);
  const auto goodput = nlohmann::json::parse(test::run_shell("cat " + (aegis_dir(run()) / "goodput.json").string()).output);
  EXPECT_GT(goodput["goodput"].get<double>(), 0);
  EXPECT_LE(goodput["goodput"].get<double>(), 1);
  EXPECT_TRUE(goodput["mttr_s"].contains("crash"));
  EXPECT_NE(r.output.find("the run finished: goodput"), std::string::npos) << r.output;
}

TEST_F(SuperviseFake, AHungJobIsDetectedWithinTheTimeoutAndItsWholeSessionKilled) {
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun r = supervise("hang@5,ok");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].cls, "hang");
  EXPECT_NE(inc[0].evidence.find("rank 0"), std::string::npos) << inc[0].evidence;
  // --hang-timeout 1 plus the 0.2 s poll; 1 s of slack for a loaded machine.
  EXPECT_LE(inc[0].time_to_detect_s, 2.2);
  EXPECT_GE(inc[0].time_to_detect_s, 1.0);
  EXPECT_LT(took, 30) << "the hung job (sleeping 1000 s) was not killed";
  // The fake job's `sleep 1000` child is in the job's session: nothing of it is left.
  EXPECT_EQ(test::run_shell("pgrep -f '[f]ake_job.sh " + run().string() + "'").output, "");
}

TEST_F(SuperviseFake, AConfigurationErrorIsNeverRetried) {
  const test::CliRun r = supervise("exit2@3,ok");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(state().attempts, 1);
  EXPECT_EQ(state().status, "gave-up");
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].cls, "config-error");
  EXPECT_NE(inc[0].action.find("not retried"), std::string::npos);
  EXPECT_NE(inc[0].evidence.find("zaya: error: bad config key"), std::string::npos) << inc[0].evidence;
  EXPECT_NE(r.output.find("GIVING UP"), std::string::npos) << r.output;
}

TEST_F(SuperviseFake, AFaultOnEveryAttemptBacksOffThenGivesUpWithASummary) {
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun r = supervise("crash@3", "--max-restarts 3 --backoff 0.2 --backoff-max 0.5");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(state().attempts, 4);
  EXPECT_EQ(state().restarts, 3);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 4u);
  // Back-offs 0.2, 0.4, then capped at 0.5 s (the first attempt's progress does not reset it:
  // no attempt gets beyond the first's step).
  EXPECT_NE(inc[0].action.find("back-off of 0.2 s"), std::string::npos) << inc[0].action;
  EXPECT_NE(inc[1].action.find("back-off of 0.4 s"), std::string::npos) << inc[1].action;
  EXPECT_NE(inc[2].action.find("back-off of 0.5 s"), std::string::npos) << inc[2].action;
  EXPECT_NE(inc[3].action.find("restart budget (3) is spent"), std::string::npos) << inc[3].action;
  EXPECT_GE(took, 1.1);
  EXPECT_NE(r.output.find("GIVING UP after 4 attempts (3 restarts)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 x crash"), std::string::npos) << r.output;
  EXPECT_EQ(state().status, "gave-up");
}

TEST_F(SuperviseFake, EachFailureClassIsNamed) {
  struct Case {
    std::string mode, cls, evidence;
  };
  for (const Case& c : {Case{"nan@4", "nonfinite", "non-finite"}, Case{"oom@4", "oom", "bad_alloc"},
                        Case{"xid@4", "hardware", "Xid"}, Case{"timeout@4", "collective-timeout", "never arrived"},
                        Case{"kill9@4", "crash", "SIGKILL"}}) {
    SCOPED_TRACE(c.mode);
    fs::remove_all(run());
    const test::CliRun r = supervise(c.mode + ",ok", "", 8);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto inc = incidents();
    ASSERT_EQ(inc.size(), 1u) << r.output;
    EXPECT_EQ(inc[0].cls, c.cls);
    EXPECT_NE(inc[0].evidence.find(c.evidence), std::string::npos) << inc[0].evidence;
  }
}

TEST_F(SuperviseFake, ALossSpikeStopsTheJobAndIsRestarted) {
  env_ = "FAKE_STEP_S=0.25 ";  // each step polled: the statistic sees every loss
  const test::CliRun r = supervise("spike@9,ok", "--spike-min-history 5", 10);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_GE(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "loss-spike");
  EXPECT_EQ(inc[0].failed_step, 9);
  EXPECT_NE(inc[0].evidence.find("loss 100"), std::string::npos) << inc[0].evidence;
}

TEST_F(SuperviseFake, AStragglerIsReportedWithoutARestart) {
  const test::CliRun r = supervise("slow", "--straggler-steps 3", 8);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "straggler");
  EXPECT_EQ(inc[0].rank, 1);
  EXPECT_NE(inc[0].action.find("none"), std::string::npos);
  EXPECT_EQ(state().attempts, 1);
}

TEST_F(SuperviseFake, WithoutHeartbeatsCrashesAreStillRecovered) {
  const test::CliRun r = supervise("silent-crash,silent-crash,silent-ok");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].cls, "crash");
  EXPECT_EQ(inc[0].rank, -1);
  EXPECT_EQ(state().attempts, 3);
}

// A host blamed twice is excluded: the next launch's {hosts} and {np} name only the other.
TEST_F(SuperviseFake, AHostThatFailsRepeatedlyIsExcluded) {
  std::ofstream(root_ / "hosts") << "alpha slots=1\nbeta slots=1\n";
  const test::CliRun r = supervise("crash@3,crash@3,ok", "--hosts " + (root_ / "hosts").string(), 6,
                                   "--host {hosts} -np {np}");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(attempt_log(1).find("args: --host alpha:1,beta:1 -np 2"), std::string::npos) << attempt_log(1);
  EXPECT_NE(attempt_log(3).find("args: --host beta:1 -np 1"), std::string::npos) << attempt_log(3);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].host, "alpha");  // rank 0 by slot order
  EXPECT_NE(inc[1].action.find("excluded host alpha after 2 failures"), std::string::npos) << inc[1].action;
  EXPECT_EQ(state().excluded_hosts, std::vector<std::string>{"alpha"});
}

TEST_F(SuperviseFake, ARestartedSupervisorPicksUpFromItsRecords) {
  // Budget 1: attempt 1 crashes, attempt 2 crashes, the supervisor gives up.
  test::CliRun r = supervise("crash@3,crash@3,ok", "--max-restarts 1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(state().attempts, 2);
  // Started again with a larger budget: attempt 3 (the job sees ZAYA_INJECT_ATTEMPT=3) finishes.
  r = supervise("crash@3,crash@3,ok", "--max-restarts 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("picking up the run"), std::string::npos) << r.output;
  EXPECT_EQ(state().attempts, 3);
  EXPECT_EQ(state().restarts, 1);  // the new supervisor's first launch is not a restart of its own
  EXPECT_NE(attempt_log(3).find("attempt=3 mode=ok"), std::string::npos);
  EXPECT_EQ(incidents().size(), 2u);
}

TEST_F(SuperviseFake, AKilledSupervisorsOrphanJobIsEndedByTheNextOne) {
  // The supervisor is SIGKILLed while its job hangs (hang timeout 1000 s): the job lives on in its
  // session. A new supervisor ends it before launching its own attempt.
  const std::string script =
      std::string(ZAYA_BINARY) + " supervise --run-dir " + run().string() +
      " --progress-every 0 --hang-timeout 1000 -- bash " + ZAYA_SOURCE_DIR + "/tests/aegis/fake_job.sh " +
      run().string() + " 20 hang@3,ok > /dev/null 2>&1 &\n"
      "sup=$!\n"
      "for i in $(seq 200); do grep -q '\"step\":2' " + (run() / "heartbeat/rank_00000.json").string() +
      " 2>/dev/null && break; sleep 0.05; done\n"
      "sleep 0.3; kill -9 $sup; wait $sup 2>/dev/null\n"
      "pgrep -f '[f]ake_job.sh " + run().string() + "' > /dev/null && echo orphan-alive\n";
  EXPECT_NE(test::run_shell(script).output.find("orphan-alive"), std::string::npos);
  const test::CliRun r = supervise("hang@3,ok");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("a previous supervisor left running"), std::string::npos) << r.output;
  EXPECT_EQ(state().attempts, 2);
  EXPECT_EQ(test::run_shell("pgrep -f '[f]ake_job.sh " + run().string() + "'").output, "");
}

// --exclude-stragglers with hosts: the slow rank's host is dropped and the job restarted without it.
TEST_F(SuperviseFake, AStragglersHostIsExcludedWhenAsked) {
  std::ofstream(root_ / "hosts") << "alpha slots=1\nbeta slots=1\n";
  const test::CliRun r = supervise("slow,ok", "--straggler-steps 3 --exclude-stragglers --hosts " +
                                   (root_ / "hosts").string(), 8, "--host {hosts}");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "straggler");
  EXPECT_EQ(inc[0].host, "beta");  // rank 1 by slot order
  EXPECT_NE(inc[0].action.find("excluded host beta"), std::string::npos) << inc[0].action;
  EXPECT_NE(attempt_log(2).find("args: --host alpha:1"), std::string::npos) << attempt_log(2);
}

// SIGTERM to the supervisor goes to the job; the supervisor records the stop and exits 128 + 15.
TEST_F(SuperviseFake, SigtermToTheSupervisorStopsTheJobAndIsRecorded) {
  const std::string script =
      std::string(ZAYA_BINARY) + " supervise --run-dir " + run().string() +
      " --progress-every 0 --hang-timeout 1000 --stop-grace 5 -- bash " + ZAYA_SOURCE_DIR +
      "/tests/aegis/fake_job.sh " + run().string() + " 20 hang@3 > /dev/null 2>&1 &\n"
      "sup=$!\n"
      "for i in $(seq 200); do grep -q '\"step\":2' " + (run() / "heartbeat/rank_00000.json").string() +
      " 2>/dev/null && break; sleep 0.05; done\n"
      "kill -TERM $sup; wait $sup; echo rc=$?\n";
  const test::CliRun r = test::run_shell(script);
  EXPECT_NE(r.output.find("rc=143"), std::string::npos) << r.output;
  EXPECT_EQ(state().status, "stopped");
  EXPECT_EQ(state().attempts, 1);
  EXPECT_EQ(test::run_shell("pgrep -f '[f]ake_job.sh " + run().string() + "'").output, "");
}

// A SIGSTOPped job writes no more heartbeats: a hang, blamed on the stopped process, which SIGKILL
// ends although it is stopped.
TEST_F(SuperviseFake, ASigstoppedJobIsAHangAndIsKilled) {
  env_ = "FAKE_STEP_S=0.1 ";
  const std::string script =
      env_ + ZAYA_BINARY + " supervise --run-dir " + run().string() + " --backoff 0.05 --progress-every 0 " +
      "--hang-timeout 1 -- bash " + ZAYA_SOURCE_DIR + "/tests/aegis/fake_job.sh " + run().string() +
      " 15 ok > " + (root_ / "sup.log").string() + " 2>&1 &\n"
      "sup=$!\n"
      "for i in $(seq 200); do grep -q '\"step\":3' " + (run() / "heartbeat/rank_00000.json").string() +
      " 2>/dev/null && break; sleep 0.05; done\n"
      "pid=$(sed 's/.*\"pid\":\\([0-9]*\\).*/\\1/' " + (run() / "heartbeat/rank_00000.json").string() + ")\n"
      "echo victim=$pid; kill -STOP $pid\n"
      "wait $sup; echo rc=$?\n";
  const test::CliRun r = test::run_shell(script);
  EXPECT_EQ(r.output.find("victim=\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "hang");
  EXPECT_NE(inc[0].evidence.find("stopped (SIGSTOP)"), std::string::npos) << inc[0].evidence;
  EXPECT_EQ(state().attempts, 2);
}

// Once the job is known to write heartbeats, an attempt that writes none is hung in start-up after
// the phase floor.
TEST_F(SuperviseFake, AnAttemptThatNeverWritesItsFirstHeartbeatIsAStartupHang) {
  const test::CliRun r = supervise("crash@3,silent-hang,ok", "--hang-phase-floor 1.5");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 2u) << r.output;
  EXPECT_EQ(inc[1].cls, "hang");
  EXPECT_NE(inc[1].evidence.find("no heartbeat within 1.5 s"), std::string::npos) << inc[1].evidence;
}

// A failure after progress beyond every earlier attempt starts the back-off over.
TEST_F(SuperviseFake, ProgressResetsTheBackOff) {
  env_ = "FAKE_STEP_S=0.05 ";
  const test::CliRun r = supervise("crash@8,crash@8,crash@16,ok", "--backoff 0.2", 20);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 3u);
  EXPECT_NE(inc[0].action.find("back-off of 0.2 s"), std::string::npos) << inc[0].action;
  EXPECT_NE(inc[1].action.find("back-off of 0.4 s"), std::string::npos) << inc[1].action;  // no further than before
  EXPECT_NE(inc[2].action.find("back-off of 0.2 s"), std::string::npos) << inc[2].action;  // step 15 > 7
}

TEST_F(SuperviseFake, ALaunchCommandThatCannotBeExecutedIsNotRetried) {
  const test::CliRun r = test::run_shell(std::string(ZAYA_BINARY) + " supervise --run-dir " + run().string() +
                                         " -- /nonexistent/zaya-train --config x.toml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot execute /nonexistent/zaya-train"), std::string::npos) << r.output;
  EXPECT_EQ(state().attempts, 1);
}

// A job that reported a collective timeout but does not exit (under mpirun, a SIGSTOPped rank can
// keep the launcher waiting) is killed after --exit-grace, heartbeats or not.
TEST_F(SuperviseFake, AJobStuckAfterReportingAFatalErrorIsKilledAfterTheGrace) {
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun r = supervise("stuck-after-timeout,ok", "--exit-grace 1");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LT(took, 20);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u) << r.output;
  EXPECT_EQ(inc[0].cls, "collective-timeout");
  EXPECT_EQ(inc[0].rank, 1);
  EXPECT_NE(r.output.find("has not exited"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zaya::aegis
