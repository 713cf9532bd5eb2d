// Fault injection (`zaya train --inject`, docs/aegis.md "Trainer side"): each kind's observable
// effect and exit code, the once-only and first-attempt gating, and the spec parser's errors.
#include "train/aegis_fixture.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/error.h"
#include "zaya/train/fault_inject.h"

namespace zaya::train::aegis_test {
namespace {

std::string parse_error(const std::string& spec) {
  try {
    parse_fault_spec(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FaultSpecs, ParseEveryKind) {
  FaultSpec k = parse_fault_spec("kill@step=37,rank=1");
  EXPECT_EQ(k.kind, FaultKind::kill);
  EXPECT_EQ(k.step, 37);
  EXPECT_EQ(k.rank, 1);
  EXPECT_FALSE(k.every_attempt);
  EXPECT_EQ(parse_fault_spec("hang@step=2").rank, -1);
  EXPECT_EQ(parse_fault_spec("nan@step=5").kind, FaultKind::nan);
  EXPECT_EQ(parse_fault_spec("nan@step=5").steps, 1);
  EXPECT_EQ(parse_fault_spec("nan@step=5,steps=3").steps, 3);
  const FaultSpec s = parse_fault_spec("slow@rank=1,factor=2.5");
  EXPECT_EQ(s.kind, FaultKind::slow);
  EXPECT_EQ(s.factor, 2.5);
  EXPECT_EQ(parse_fault_spec("corrupt-ckpt@step=10").kind, FaultKind::corrupt_ckpt);
  EXPECT_EQ(parse_fault_spec("kill-during-save@step=10,rank=0").kind, FaultKind::kill_during_save);
  const FaultSpec e = parse_fault_spec("exit@step=4,code=7,every-attempt=1");
  EXPECT_EQ(e.code, 7);
  EXPECT_TRUE(e.every_attempt);
}

TEST(FaultSpecs, ErrorsNameTheSpecAndTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"crash@step=3", "unknown kind"},
      {"kill", "no '@'"},
      {"kill@", "no KEY=VALUE"},
      {"kill@rank=1", "needs step=S"},
      {"kill@step=x", "not an integer"},
      {"kill@step=0", "step must be >= 1"},
      {"kill@step=3,rank=-1", "rank must be"},
      {"kill@step=3,code=1", "does not apply"},
      {"exit@step=3", "needs code=C"},
      {"exit@step=3,code=300", "code must be 0..255"},
      {"slow@factor=2", "needs rank=R"},
      {"slow@rank=0", "needs factor=F"},
      {"slow@rank=0,factor=0.5", ">= 1"},
      {"slow@rank=0,factor=2,step=0", "step must be >= 1"},
      {"kill@step=3,attempt=0", "attempt must be >= 1"},
      {"kill@step=3,attempt=2,every-attempt=1", "contradict"},
      {"kill@step=3,every-attempt=yes", "0 or 1"},
      {"kill@step=3,", "not KEY=VALUE"},
      {"nan@step=3,steps=0", "steps must be >= 1"},
      {"kill@step=3,steps=2", "does not apply"},
  };
  for (const auto& [spec, what] : cases) {
    const std::string e = parse_error(spec);
    EXPECT_NE(e.find("\"" + spec + "\""), std::string::npos) << spec << ": " << e;
    EXPECT_NE(e.find(what), std::string::npos) << spec << ": " << e;
  }
}

// Which faults a process arms: its rank's, only for steps after the one it started at, and only
// on the first attempt unless every-attempt=1. Each fires once.
TEST(FaultSpecs, ArmingAndFiringOnce) {
  const std::vector<std::string> specs = {"kill@step=5,rank=1", "exit@step=8,code=3",
                                          "nan@step=9,every-attempt=1", "corrupt-ckpt@step=10,rank=1",
                                          "slow@rank=0,factor=3"};
  FaultInjector r0(specs, /*rank=*/0, /*start_step=*/0, /*attempt=*/1);
  EXPECT_EQ(r0.take(FaultKind::kill, 5), nullptr) << "rank 1's";
  ASSERT_NE(r0.take(FaultKind::exit, 8), nullptr);
  EXPECT_EQ(r0.take(FaultKind::exit, 8), nullptr) << "fires once";
  EXPECT_EQ(r0.take(FaultKind::nan, 8), nullptr) << "only at its step";
  EXPECT_NE(r0.take(FaultKind::corrupt_ckpt, 10), nullptr) << "rank 0 corrupts rank file 1";
  EXPECT_EQ(r0.slow_factor(1), 3.0);
  FaultInjector r1(specs, 1, 0, 1);
  EXPECT_NE(r1.take(FaultKind::kill, 5), nullptr);
  EXPECT_EQ(r1.take(FaultKind::corrupt_ckpt, 10), nullptr);
  EXPECT_EQ(r1.slow_factor(1), 1.0);
  FaultInjector resumed(specs, 0, /*start_step=*/8, 1);
  EXPECT_EQ(resumed.take(FaultKind::exit, 8), nullptr) << "a run resumed at step 8 is past it";
  EXPECT_NE(resumed.take(FaultKind::nan, 9), nullptr);
  FaultInjector streak({"nan@step=4,steps=3"}, 0, 0, 1);
  EXPECT_EQ(streak.take(FaultKind::nan, 3), nullptr);
  for (int64_t s : {4, 5, 6}) EXPECT_NE(streak.take(FaultKind::nan, s), nullptr) << s;
  EXPECT_EQ(streak.take(FaultKind::nan, 7), nullptr);
  EXPECT_EQ(streak.take(FaultKind::nan, 6), nullptr) << "disarmed after its last step";
  FaultInjector second(specs, 0, 0, /*attempt=*/2);
  EXPECT_EQ(second.take(FaultKind::exit, 8), nullptr);
  EXPECT_EQ(second.slow_factor(1), 1.0);
  EXPECT_NE(second.take(FaultKind::nan, 9), nullptr) << "every-attempt=1";
}

// attempt=N fires on attempt N only, so that one supervised run can meet two faults in turn; a
// slow with step=S stretches the steps from S on, also in a run resumed past S.
TEST(FaultSpecs, AttemptNAndASlowOnset) {
  const std::vector<std::string> specs = {"kill@step=3", "kill@step=7,attempt=2", "slow@rank=0,factor=4,step=5"};
  FaultInjector first(specs, 0, 0, 1);
  EXPECT_NE(first.take(FaultKind::kill, 3), nullptr);
  EXPECT_EQ(first.take(FaultKind::kill, 7), nullptr) << "attempt 2's";
  EXPECT_EQ(first.slow_factor(4), 1.0);
  EXPECT_EQ(first.slow_factor(5), 4.0);
  FaultInjector second(specs, 0, /*start_step=*/2, 2);
  EXPECT_EQ(second.take(FaultKind::kill, 3), nullptr) << "attempt 1's";
  EXPECT_NE(second.take(FaultKind::kill, 7), nullptr);
  FaultInjector third(specs, 0, /*start_step=*/6, 3);
  EXPECT_EQ(third.take(FaultKind::kill, 7), nullptr);
  EXPECT_EQ(third.slow_factor(6), 1.0) << "slow is attempt 1's unless every-attempt=1";
  FaultInjector resumed({"slow@rank=0,factor=4,step=5,every-attempt=1"}, 0, /*start_step=*/9, 3);
  EXPECT_EQ(resumed.slow_factor(10), 4.0);
  EXPECT_EQ(parse_fault_spec("exit@step=4,code=7,attempt=3").attempt, 3);
}

class FaultInjection : public recovery::RecoveryTest {
 protected:
  test::CliRun train(const std::string& run, int steps, const std::string& args,
                     const std::string& env = "") {
    return test::run_shell(kMpiEnv + env + " " + ZAYA_BINARY + " --threads 1 train --config " +
                           config_file(run, steps) + " " + args);
  }
};

TEST_F(FaultInjection, KillIsSignalNineAtItsStep) {
  const test::CliRun r = train("run", 20, "--inject kill@step=3");
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  const nlohmann::json b = *heartbeat(root_ / "run", 0);
  EXPECT_EQ(b["step"], 3);
  EXPECT_EQ(b["phase"], "train");
}

TEST_F(FaultInjection, ExitUsesItsCode) {
  const test::CliRun r = train("run", 20, "--inject exit@step=4,code=7");
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_EQ(heartbeat(root_ / "run", 0)->at("step"), 4);
}

// Attempt gating: the same spec on a supervisor's second attempt does nothing unless
// every-attempt=1; a run resumed past the step does not fire it either. Also from train.inject.
TEST_F(FaultInjection, FiresOnlyOnTheFirstAttemptAndBeforeItsStep) {
  EXPECT_EQ(train("a", 6, "--inject exit@step=4,code=7", "ZAYA_INJECT_ATTEMPT=2").code, 0);
  EXPECT_EQ(train("b", 6, "--inject exit@step=4,code=7,every-attempt=1", "ZAYA_INJECT_ATTEMPT=2").code, 7);
  EXPECT_EQ(train("c", 6, "--set 'train.inject=[\"exit@step=4,code=9\"]'").code, 9);
  const test::CliRun bad = train("d", 6, "--inject exit@step=4,code=7", "ZAYA_INJECT_ATTEMPT=two");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("ZAYA_INJECT_ATTEMPT"), std::string::npos) << bad.output;
  ASSERT_EQ(train("e", 10, "--set optim.total_steps=20").code, 0);
  const test::CliRun resumed =
      train("e", 20, "--resume --set optim.total_steps=20 --inject exit@step=5,code=7");
  EXPECT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(heartbeat(root_ / "e", 0)->at("step"), 20);
}

// A corrupted checkpoint: the run itself finishes, `zaya ckpt verify` fails on that step, and the
// resume skips it for the previous one.
TEST_F(FaultInjection, CorruptCheckpointFailsVerifyAndResumeTakesThePreviousOne) {
  const fs::path run = root_ / "run";
  ASSERT_EQ(train("run", 20, "--set optim.total_steps=30 --inject corrupt-ckpt@step=20").code, 0);
  EXPECT_EQ(test::run_zaya("ckpt verify " + (run / "step_0000020").string()).code, 1);
  EXPECT_EQ(test::run_zaya("ckpt verify " + (run / "step_0000010").string()).code, 0);
  const test::CliRun r = train("run", 30, "--resume --set optim.total_steps=30");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + (run / "step_0000010").string()), std::string::npos) << r.output;
}

// Killed while the checkpoint of step 20 is written (its rank file is there, the commit is not):
// signal 9, and step 10 stays the newest checkpoint, valid.
TEST_F(FaultInjection, KillDuringSaveLeavesThePreviousCheckpoint) {
  const fs::path run = root_ / "run";
  const test::CliRun r = train("run", 20, "--inject kill-during-save@step=20");
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(fs::exists(run / "step_0000020.tmp" / "rank_00000.safetensors"));
  EXPECT_EQ(ckpt::list_steps(run), std::vector<int64_t>{10});
  EXPECT_EQ(test::run_zaya("ckpt verify " + run.string()).code, 0);
  EXPECT_EQ(heartbeat(run, 0)->at("phase"), "ckpt-write");
}

// A hang: the process lives on, its heartbeat's seq stops at the hung step.
TEST_F(FaultInjection, HangStopsTheHeartbeatWhileTheProcessLives) {
  const fs::path run = root_ / "run";
  Spawned job(kMpiEnv + ZAYA_BINARY + " --threads 1 train --config " + config_file("run", 20) +
                  " --inject hang@step=3",
              root_ / "run.log");
  ASSERT_TRUE(wait_until([&] {
    const auto b = heartbeat(run, 0);
    return b && (*b)["step"].get<int64_t>() >= 3;
  }));
  const int64_t seq = heartbeat(run, 0)->at("seq").get<int64_t>();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(job.running()) << file_bytes(root_ / "run.log");
  const nlohmann::json b = *heartbeat(run, 0);
  EXPECT_EQ(b["seq"], seq);
  EXPECT_EQ(b["step"], 3);
  job.kill_group();
  job.wait();
}

// A slow rank: its steps take about `factor` times as long. Medians of 12 steps; the bound (2x for
// a factor of 5) leaves room for a loaded machine.
TEST_F(FaultInjection, SlowStretchesTheStepTime) {
  ASSERT_EQ(train("base", 12, "--set ckpt.every=0 --set ckpt.save_final=false").code, 0);
  ASSERT_EQ(
      train("slow", 12, "--set ckpt.every=0 --set ckpt.save_final=false --inject slow@rank=0,factor=5").code,
      0);
  std::vector<double> base, slow;
  for (const auto& r : step_records(root_ / "base")) base.push_back(r["time"]["step"].get<double>());
  for (const auto& r : step_records(root_ / "slow")) slow.push_back(r["time"]["step"].get<double>());
  EXPECT_GT(median(slow), 2 * median(base)) << median(slow) << " vs " << median(base);
  EXPECT_GT(heartbeat(root_ / "slow", 0)->at("step_time").get<double>(), 2 * median(base));
}

}  // namespace
}  // namespace zaya::train::aegis_test
