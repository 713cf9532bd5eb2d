// The trainer's heartbeat files and exit codes (docs/aegis.md, "Trainer side"): what a supervisor
// reads to tell progress, hangs and the kind of failure apart, at 1 and 2 ranks.
#include <set>

#include "train/aegis_fixture.h"
#include "zaya/train/heartbeat.h"

namespace zaya::train::aegis_test {
namespace {

class Heartbeats : public recovery::RecoveryTest {
 protected:
  std::string zaya_cmd(const std::string& args, int np = 1) {
    return kMpiEnv + (np > 1 ? "mpirun --oversubscribe -np " + std::to_string(np) + " " : std::string()) +
           ZAYA_BINARY + " --threads 1 train " + args;
  }
};

void expect_complete_beat(const nlohmann::json& b, int rank, int world) {
  for (const char* key : {"rank", "world", "pid", "host", "seq", "step", "phase", "time", "loss", "grad_norm",
                          "step_time", "busy_time", "nonfinite", "error"})
    EXPECT_TRUE(b.contains(key)) << key << " missing in " << b.dump();
  EXPECT_EQ(b.size(), 14u) << b.dump();
  EXPECT_EQ(b["rank"], rank);
  EXPECT_EQ(b["world"], world);
  EXPECT_GT(b["pid"].get<int64_t>(), 0);
  EXPECT_FALSE(b["host"].get<std::string>().empty());
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(b["time"].get<double>(), now, 600.0) << "unix seconds";
}

// One rank, 40 steps, a checkpoint every 10: read while the run goes, every beat parses (writes
// are renames), seq only grows and the step never goes back; the last beat is "done" with the
// last step's numbers, and seq counts the writes (at most one per beat: beats closer than 20 ms
// are coalesced).
TEST_F(Heartbeats, OneRankProgressAndFinalBeat) {
  const fs::path run = root_ / "run";
  Spawned job(zaya_cmd("--config " + config_file("run", 40)), root_ / "run.log");
  int64_t last_seq = 0, last_step = 0, reads = 0;
  std::set<std::string> phases;
  while (job.running()) {
    const auto b = heartbeat(run, 0);
    if (b) {
      ++reads;
      EXPECT_GE((*b)["seq"].get<int64_t>(), last_seq);
      EXPECT_GE((*b)["step"].get<int64_t>(), last_step);
      last_seq = (*b)["seq"].get<int64_t>();
      last_step = (*b)["step"].get<int64_t>();
      phases.insert((*b)["phase"].get<std::string>());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int status = job.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << file_bytes(root_ / "run.log");
  EXPECT_GT(reads, 0);
  const nlohmann::json b = *heartbeat(run, 0);
  expect_complete_beat(b, 0, 1);
  EXPECT_EQ(b["phase"], "done");
  EXPECT_EQ(b["step"], 40);
  EXPECT_TRUE(b["error"].is_null());
  EXPECT_FALSE(b["nonfinite"].get<bool>());
  EXPECT_GT(b["step_time"].get<double>(), 0.0);
  EXPECT_GE(b["busy_time"].get<double>(), 0.0);
  EXPECT_LE(b["busy_time"].get<double>(), b["step_time"].get<double>()) << "a part of the step";
  EXPECT_GT(b["grad_norm"].get<double>(), 0.0);
  // The last step's loss, as metrics.jsonl has it.
  EXPECT_EQ(b["loss"].get<double>(), step_records(run).back()["loss"].get<double>());
  // At most 2 start + 40 steps + 3 periodic saves x (snapshot, write) + final eval (enter, leave) +
  // final save (snapshot, write, commit) + done = 54, plus a commit beat for each periodic save whose
  // background commit a step boundary saw land (0 to 3).
  EXPECT_GE(b["seq"].get<int64_t>(), 1);
  EXPECT_LE(b["seq"].get<int64_t>(), 57);
  EXPECT_FALSE(fs::exists(run / "heartbeat" / "rank_00000.json.tmp"));
}

// Two ranks under mpirun: each writes its own file with its rank, the world and its own pid; both
// end "done" at the same step with the same (global) loss. Rank 1 never commits, so its beat count
// is exact: 2 start + 20 steps + (snapshot, write) at step 10 + 2 eval + (snapshot, write) at the
// end + done = 29.
TEST_F(Heartbeats, TwoRanksEachWriteTheirOwn) {
  const fs::path run = root_ / "run";
  const test::CliRun r = test::run_shell(zaya_cmd("--config " + config_file("run", 20), 2));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json b0 = *heartbeat(run, 0), b1 = *heartbeat(run, 1);
  expect_complete_beat(b0, 0, 2);
  expect_complete_beat(b1, 1, 2);
  EXPECT_NE(b0["pid"], b1["pid"]);
  for (const nlohmann::json* b : {&b0, &b1}) {
    EXPECT_EQ((*b)["phase"], "done");
    EXPECT_EQ((*b)["step"], 20);
  }
  EXPECT_EQ(b0["loss"], b1["loss"]);
  EXPECT_LE(b1["seq"].get<int64_t>(), 29);  // at most one write per beat
  EXPECT_LE(b0["seq"].get<int64_t>(), 31);  // + the final commit, + step 10's if a boundary saw it
}

// Beats faster than one per 20 ms are coalesced, the newest written: a burst of 2000 beats makes
// few writes (the burst takes milliseconds), the file holds the last one after a flush, and a lone
// beat after a pause is on disk within the interval without a flush.
TEST(HeartbeatWriter, CoalescesBurstsAndWritesTheNewest) {
  const fs::path dir = fs::temp_directory_path() / ("zaya_hb_unit_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    Heartbeat hb(dir.string(), 3, 4);
    const auto start = std::chrono::steady_clock::now();
    for (int s = 1; s <= 2000; ++s) hb.step_end(s, 2.5, 1.0, 0.001, 0.001);
    hb.flush();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto b = heartbeat(dir, 3);
    ASSERT_TRUE(b);
    EXPECT_EQ((*b)["step"], 2000);
    EXPECT_EQ((*b)["seq"], hb.seq());
    // One write per 20 ms elapsed, + the first (no wait) and the flush's; a generous 2x margin.
    EXPECT_LE(hb.seq(), 2 * (took / 0.020 + 2)) << took << " s";
    EXPECT_LT(hb.seq(), 2000);
    const int64_t before = hb.seq();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    hb.beat("eval", 2000);
    int64_t seen = before;
    for (int i = 0; i < 200 && seen == before; ++i) {  // up to 2 s on a loaded machine
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (const auto e = heartbeat(dir, 3)) seen = (*e)["seq"].get<int64_t>();
    }
    EXPECT_EQ(seen, before + 1) << "a lone beat is written without a flush";
  }
  fs::remove_all(dir);
}

// train.heartbeat = false (only to measure what heartbeats cost) writes none.
TEST_F(Heartbeats, SwitchedOffWritesNone) {
  const test::CliRun r =
      test::run_shell(zaya_cmd("--config " + config_file("run", 3) + " --set train.heartbeat=false"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(root_ / "run" / "latest"));
  EXPECT_FALSE(fs::exists(root_ / "run" / "heartbeat"));
}

// A stop signal: the checkpoint is saved, the exit code is 0 and the last beat says "stopping".
TEST_F(Heartbeats, SignalledStopEndsInStopping) {
  const fs::path run = root_ / "run";
  Spawned job(zaya_cmd("--config " + config_file("run", 1000000)), root_ / "run.log");
  ASSERT_TRUE(wait_until([&] {
    const auto b = heartbeat(run, 0);
    return b && (*b)["step"].get<int64_t>() >= 3;
  }));
  const int64_t p = heartbeat(run, 0)->at("pid").get<int64_t>();
  kill(static_cast<pid_t>(p), SIGTERM);
  const int status = job.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << file_bytes(root_ / "run.log");
  const nlohmann::json b = *heartbeat(run, 0);
  EXPECT_EQ(b["phase"], "stopping");
  // The stop's checkpoint is the newest, at the step the last beat names (beats are coalesced, so
  // the run may have passed a periodic checkpoint before the signal landed).
  const std::vector<int64_t> steps = ckpt::list_steps(run);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(*std::max_element(steps.begin(), steps.end()), b["step"].get<int64_t>());
}

// Exit 4: non-finite gradients for train.max_skipped_steps steps in a row (here 1, from an injected
// NaN at step 3). The last beat is "failed" with the error, nonfinite set, and the norm null.
TEST_F(Heartbeats, NonFiniteStopExitsFour) {
  const fs::path run = root_ / "run";
  const test::CliRun r = test::run_shell(zaya_cmd("--config " + config_file("run", 20) +
                                                  " --set train.max_skipped_steps=1 --inject nan@step=3"));
  EXPECT_EQ(r.code, 4) << r.output;
  const nlohmann::json b = *heartbeat(run, 0);
  EXPECT_EQ(b["phase"], "failed");
  EXPECT_EQ(b["step"], 3);
  EXPECT_TRUE(b["nonfinite"].get<bool>());
  EXPECT_TRUE(b["grad_norm"].is_null());
  EXPECT_NE(b["error"].get<std::string>().find("max_skipped_steps"), std::string::npos) << b.dump();
}

// With the default train.max_skipped_steps (10), a streak of 10 NaN steps is what stops the run.
TEST_F(Heartbeats, NanStreakReachesTheDefaultLimit) {
  const test::CliRun r =
      test::run_shell(zaya_cmd("--config " + config_file("run", 20) + " --inject nan@step=3,steps=10"));
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_EQ(heartbeat(root_ / "run", 0)->at("step"), 12);
}

// The same at two ranks with the NaN on rank 1 only: the clipping norm is global, so both ranks
// skip the update, stop, and say so.
TEST_F(Heartbeats, NonFiniteStopOnOneRankStopsBoth) {
  const fs::path run = root_ / "run";
  const test::CliRun r = test::run_shell(zaya_cmd(
      "--config " + config_file("run", 20) + " --set train.max_skipped_steps=1 --inject nan@step=3,rank=1",
      2));
  EXPECT_EQ(r.code, 4) << r.output;
  for (int rank : {0, 1}) {
    const nlohmann::json b = *heartbeat(run, rank);
    EXPECT_EQ(b["phase"], "failed") << rank;
    EXPECT_TRUE(b["nonfinite"].get<bool>()) << rank;
  }
}

// Exit 3: a rank that stops arriving (rank 1 hangs after step 3) makes rank 0's next collective
// time out (parallel.timeout_s = 3), which names the missing rank.
TEST_F(Heartbeats, CollectiveTimeoutExitsThree) {
  const fs::path run = root_ / "run";
  const test::CliRun r = test::run_shell(zaya_cmd(
      "--config " + config_file("run", 20) + " --set parallel.timeout_s=3 --inject hang@step=3,rank=1", 2));
  EXPECT_EQ(r.code, 3) << r.output;
  const nlohmann::json b0 = *heartbeat(run, 0), b1 = *heartbeat(run, 1);
  EXPECT_EQ(b0["phase"], "failed");
  EXPECT_EQ(b1["phase"], "train");  // the hung rank wrote nothing after its step
  EXPECT_EQ(b1["step"], 3);
}

// The timeout ends the process at once even with a checkpoint commit in flight that waits for the
// lost rank (the commit test hook holds every save 120 s before its commit): unwinding would wait
// for that commit first.
TEST_F(Heartbeats, CollectiveTimeoutDuringABackgroundCommitExitsAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun r = test::run_shell(zaya_cmd("--config " + config_file("run", 20) +
                                                      " --set ckpt.every=2 --set parallel.timeout_s=3 "
                                                      "--test-pause-commit-ms 120000 --inject hang@step=3,rank=1",
                                                  2));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(seconds, 60.0) << "waited for the commit held 120 s";
  EXPECT_EQ(heartbeat(root_ / "run", 0)->at("phase"), "failed");
}

// Exit 5: a checkpoint save that fails (a file-size limit smaller than the rank file, as a full
// disk) stops the run with the save named; the last beat is "failed".
TEST_F(Heartbeats, FailedSaveExitsFive) {
  const fs::path run = root_ / "run";
  const test::CliRun r =
      test::run_shell("trap '' XFSZ; ulimit -f 64; " +
                      zaya_cmd("--config " + config_file("run", 40) + " --set ckpt.save_final=false"));
  EXPECT_EQ(r.code, 5) << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_EQ(heartbeat(run, 0)->at("phase"), "failed");
}

// A start-up that fails after the run lock (here a resume whose config changes the learning rate)
// is still exit 2, and the heartbeat says "failed" with the reason.
TEST_F(Heartbeats, StartUpFailureBeatsFailed) {
  const fs::path run = root_ / "run";
  ASSERT_EQ(test::run_shell(zaya_cmd("--config " + config_file("run", 10))).code, 0);
  const test::CliRun r =
      test::run_shell(zaya_cmd("--config " + config_file("run", 10) + " --resume --set optim.lr=1e-2"));
  EXPECT_EQ(r.code, 2) << r.output;
  const nlohmann::json b = *heartbeat(run, 0);
  EXPECT_EQ(b["phase"], "failed");
  EXPECT_EQ(b["step"], 0) << "nothing was loaded";
  EXPECT_NE(b["error"].get<std::string>().find("optim.lr"), std::string::npos) << b.dump();
}

// Exit 2 stays bad input: an unknown injection or a malformed window, named, before anything runs.
TEST_F(Heartbeats, BadInputStillExitsTwo) {
  const std::string cfg = config_file("run", 20);
  test::CliRun r = test::run_shell(zaya_cmd("--config " + cfg + " --inject crash@step=3"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("crash@step=3"), std::string::npos) << r.output;
  r = test::run_shell(zaya_cmd("--config " + cfg + " --skip-samples 9:3"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("9:3"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ / "run" / "heartbeat")) << "refused before the run directory is used";
}

}  // namespace
}  // namespace zaya::train::aegis_test
