// The supervisor's rules without processes: log patterns, the heartbeat monitor (hang timeouts,
// non-finite values, loss spikes, stragglers), exit classification, hosts files, the relaunch
// command and the state's round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "zaya/aegis/heartbeat.h"
#include "zaya/aegis/monitor.h"
#include "zaya/aegis/recovery.h"
#include "zaya/aegis/run_state.h"

namespace zaya::aegis {
namespace {
namespace fs = std::filesystem;

Heartbeat beat(int rank, int world, int64_t seq, int64_t step, const std::string& phase, double time,
               std::optional<double> loss = 2.0, std::optional<double> step_time = 0.1) {
  Heartbeat h;
  h.rank = rank;
  h.world = world;
  h.pid = 100 + rank;
  h.host = "host" + std::to_string(rank);
  h.seq = seq;
  h.step = step;
  h.phase = phase;
  h.time = time;
  h.loss = loss;
  h.step_time = step_time;
  return h;
}

TEST(AegisHeartbeat, ParsesTheContractFormatAndRejectsPartialOnes) {
  const auto h = parse_heartbeat(
      R"({"rank": 1, "world": 2, "pid": 7, "host": "n1", "seq": 5, "step": 37, "phase": "ckpt-write", "time": 12.5,
          "loss": null, "grad_norm": 0.5, "step_time": 0.25, "nonfinite": true, "error": "boom"})");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->rank, 1);
  EXPECT_EQ(h->step, 37);
  EXPECT_EQ(h->phase, "ckpt-write");
  EXPECT_FALSE(h->loss);
  EXPECT_EQ(*h->grad_norm, 0.5);
  EXPECT_TRUE(h->nonfinite);
  EXPECT_EQ(h->error, "boom");
  EXPECT_FALSE(h->busy_time) << "absent: a trainer that does not report it";
  const auto b = parse_heartbeat(
      R"({"rank": 0, "world": 2, "pid": 7, "host": "n1", "seq": 5, "step": 37, "phase": "train", "time": 12.5,
          "loss": 2.5, "grad_norm": 0.5, "step_time": 0.25, "busy_time": 0.125, "nonfinite": false, "error": null})");
  ASSERT_TRUE(b);
  EXPECT_EQ(*b->busy_time, 0.125);
  EXPECT_FALSE(parse_heartbeat(R"({"rank": 1, "world": 2, "pid": 7)"));           // cut short
  EXPECT_FALSE(parse_heartbeat(R"({"rank": 1, "world": 2, "pid": 7, "seq": 1})"));  // keys missing
}

TEST(AegisLogHints, RecognizesOomHardwareAndCollectiveTimeoutLines) {
  LogHints h;
  h.scan("step 12 loss 2.3");
  EXPECT_TRUE(h.oom_line.empty() && h.hardware_line.empty() && h.collective_timeout_line.empty());
  h.scan("terminate called after throwing an instance of 'std::bad_alloc'");
  h.scan("NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, DBE (double bit error) ECC error");
  h.scan("zaya: error: collective #9 (all_reduce) on rank 0 of 2 timed out after 5 s: rank 1 never arrived (no answer)");
  EXPECT_NE(h.oom_line.find("bad_alloc"), std::string::npos);
  EXPECT_NE(h.hardware_line.find("Xid"), std::string::npos);
  EXPECT_EQ(h.missing_rank, 1);
  LogHints cuda;
  cuda.scan("CUDA error: out of memory (cudaMalloc of 2 GiB)");
  EXPECT_FALSE(cuda.oom_line.empty());
  // The launcher names the rank that failed first; the first such line counts.
  for (const auto& [line, rank] : std::vector<std::pair<std::string, int>>{
           {"mpirun noticed that process rank 3 with PID 0 on node vm exited on signal 9 (Killed).", 3},
           {"  Process name: [[43461,1],5]", 5},
           {"srun: error: nid00042: task 7: Exited with exit code 1", 7},
           {"srun: error: nid00042: tasks 2-3: Killed", 2}}) {
    LogHints l;
    l.scan("step 12 loss 2.3 rank 9");
    l.scan(line);
    l.scan("mpirun noticed that process rank 11 with PID 0 on node vm exited on signal 15 (Terminated).");
    EXPECT_EQ(l.launcher_rank, rank) << line;
  }
}

TEST(AegisMonitor, HangIsNoSeqProgressPastTheTimeoutWithAFloorForCheckpointPhases) {
  MonitorOptions o;
  o.hang_timeout_s = 5;
  o.hang_phase_floor_s = 60;
  AttemptMonitor m(o, 0);
  EXPECT_FALSE(m.observe({{0, beat(0, 2, 1, 1, "train", 1)}, {1, beat(1, 2, 1, 1, "train", 1)}}, 1));
  // Rank 0 moves on, rank 1 stays: a hang of rank 1 only after 5 s without a new seq.
  EXPECT_FALSE(m.observe({{0, beat(0, 2, 2, 2, "train", 5)}, {1, beat(1, 2, 1, 1, "train", 1)}}, 5.9));
  auto d = m.observe({{0, beat(0, 2, 3, 3, "train", 6)}, {1, beat(1, 2, 1, 1, "train", 1)}}, 6.2);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->cls, FailureClass::hang);
  EXPECT_EQ(d->rank, 1);
  EXPECT_NE(d->evidence.find("rank 1"), std::string::npos) << d->evidence;
  // Both ranks silent (rank 0 waits in a collective for rank 1): the stopped process is blamed,
  // though rank 0 went quiet first.
  AttemptMonitor both(o, 0);
  both.set_process_state([](const std::string&, int64_t pid) { return pid == 101 ? 'T' : 'S'; });
  both.observe({{0, beat(0, 2, 1, 1, "train", 1)}, {1, beat(1, 2, 1, 1, "train", 1)}}, 1);
  both.observe({{0, beat(0, 2, 1, 1, "train", 1)}, {1, beat(1, 2, 2, 1, "train", 1.5)}}, 1.5);
  d = both.observe({{0, beat(0, 2, 1, 1, "train", 1)}, {1, beat(1, 2, 2, 1, "train", 1.5)}}, 7);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->rank, 1);
  EXPECT_NE(d->evidence.find("stopped (SIGSTOP)"), std::string::npos) << d->evidence;
  // A rank writing a checkpoint gets the floor.
  AttemptMonitor c(o, 0);
  EXPECT_FALSE(c.observe({{0, beat(0, 1, 1, 5, "ckpt-write", 1)}}, 1));
  EXPECT_FALSE(c.observe({{0, beat(0, 1, 1, 5, "ckpt-write", 1)}}, 50));
  EXPECT_TRUE(c.observe({{0, beat(0, 1, 1, 5, "ckpt-write", 1)}}, 62));
  // A finished rank never hangs.
  AttemptMonitor f(o, 0);
  EXPECT_FALSE(f.observe({{0, beat(0, 1, 1, 5, "done", 1)}}, 1));
  EXPECT_FALSE(f.observe({{0, beat(0, 1, 1, 5, "done", 1)}}, 1000));
}

TEST(AegisMonitor, LearnedHangTimeoutIsTwiceTheMedianStepTimePlusTen) {
  MonitorOptions o;  // hang_timeout_s = 0: learned
  o.hang_min_s = 10;
  AttemptMonitor m(o, 0);
  EXPECT_EQ(m.hang_timeout("train"), 10);  // no step seen: the floor
  for (int s = 1; s <= 9; ++s) m.observe({{0, beat(0, 1, s, s, "train", s, 2.0, 20.0)}}, s);
  EXPECT_DOUBLE_EQ(m.hang_timeout("train"), 2 * 20.0 + 10);
  EXPECT_DOUBLE_EQ(m.hang_timeout("ckpt-commit"), std::max(50.0, o.hang_phase_floor_s));
}

TEST(AegisMonitor, NonfiniteHeartbeatThenExitFourIsNonfiniteAtThatStep) {
  AttemptMonitor m({}, 0);
  Heartbeat h = beat(0, 1, 4, 17, "train", 1, std::nullopt);
  h.nonfinite = true;
  EXPECT_FALSE(m.observe({{0, h}}, 1));  // the trainer decides whether it stops
  const Detection d = m.classify_exit(4, 2);
  EXPECT_EQ(d.cls, FailureClass::nonfinite);
  EXPECT_EQ(d.step, 17);
  EXPECT_EQ(AttemptMonitor({}, 0).classify_exit(4, 1).cls, FailureClass::nonfinite);  // exit 4 alone
}

TEST(AegisMonitor, LossSpikeAgainstTheRunningStatistic) {
  MonitorOptions o;
  o.spike_min_history = 10;
  AttemptMonitor m(o, 0);
  // Losses 3.00, 2.99, ... with a little noise: no spike; then 9.0 is one.
  for (int s = 1; s <= 30; ++s)
    ASSERT_FALSE(m.observe({{0, beat(0, 1, s, s, "train", s, 3.0 - 0.01 * s + 0.02 * (s % 3))}}, s)) << s;
  const auto d = m.observe({{0, beat(0, 1, 31, 31, "train", 31, 9.0)}}, 31);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->cls, FailureClass::loss_spike);
  EXPECT_EQ(d->step, 31);
  // A loss higher than the mean by the ratio but within z standard deviations of noisy losses is not.
  AttemptMonitor noisy(o, 0);
  for (int s = 1; s <= 30; ++s) noisy.observe({{0, beat(0, 1, s, s, "train", s, s % 2 ? 1.0 : 5.0)}}, s);
  EXPECT_FALSE(noisy.observe({{0, beat(0, 1, 31, 31, "train", 31, 6.0)}}, 31));
}

TEST(AegisMonitor, StragglerIsARankPersistentlySlowerThanTheOthers) {
  MonitorOptions o;
  o.straggler_factor = 2;
  o.straggler_steps = 3;
  AttemptMonitor m(o, 0);
  for (int s = 1; s <= 2; ++s)
    m.observe({{0, beat(0, 3, s, s, "train", s, 2, 0.1)}, {1, beat(1, 3, s, s, "train", s, 2, 0.1)},
               {2, beat(2, 3, s, s, "train", s, 2, 0.5)}}, s);
  EXPECT_FALSE(m.straggler());  // two slow steps: not yet persistent
  m.observe({{0, beat(0, 3, 3, 3, "train", 3, 2, 0.1)}, {1, beat(1, 3, 3, 3, "train", 3, 2, 0.1)},
             {2, beat(2, 3, 3, 3, "train", 3, 2, 0.5)}}, 3);
  ASSERT_TRUE(m.straggler());
  EXPECT_EQ(m.straggler()->rank, 2);
  EXPECT_EQ(m.straggler()->cls, FailureClass::straggler);
}

// In synchronous data parallelism every rank's step lasts as long as the slowest rank's: the
// ranks' own times (busy_time) find the straggler, whatever the step times say.
TEST(AegisMonitor, StragglerIsFoundByTheRanksOwnTimesWhenReported) {
  MonitorOptions o;
  o.straggler_steps = 3;
  AttemptMonitor m(o, 0);
  for (int s = 1; s <= 3; ++s) {
    std::map<int, Heartbeat> beats;
    for (int r = 0; r < 3; ++r) {
      beats[r] = beat(r, 3, s, s, "train", s, 2, /*step_time=*/0.5);
      beats[r].busy_time = r == 1 ? 0.45 : 0.05;
    }
    m.observe(beats, s);
  }
  ASSERT_TRUE(m.straggler());
  EXPECT_EQ(m.straggler()->rank, 1);
  EXPECT_NE(m.straggler()->evidence.find("own work"), std::string::npos) << m.straggler()->evidence;
}

TEST(AegisMonitor, ClassifiesExitCodesSignalsAndLogLines) {
  auto cls = [](int status, const std::string& line = "") {
    AttemptMonitor m({}, 0);
    if (!line.empty()) m.scan_line(line);
    return m.classify_exit(status, 1);
  };
  EXPECT_EQ(cls(1).cls, FailureClass::crash);
  EXPECT_EQ(cls(2).cls, FailureClass::config_error);
  EXPECT_EQ(cls(3).cls, FailureClass::collective_timeout);
  EXPECT_EQ(cls(5).cls, FailureClass::ckpt_save);
  const Detection killed = cls(137);
  EXPECT_EQ(killed.cls, FailureClass::crash);
  EXPECT_NE(killed.evidence.find("SIGKILL"), std::string::npos) << killed.evidence;
  EXPECT_EQ(cls(137, "Out of memory: Killed process 4242 (zaya)").cls, FailureClass::oom);
  EXPECT_EQ(cls(1, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.").cls, FailureClass::hardware);
  // A collective timeout reported through the generic error exit is still a collective timeout,
  // not a configuration error that would never be retried.
  const Detection t = cls(2, "zaya: error: collective #3 (all_reduce) on rank 0 of 2 timed out after 5 s: rank 1 "
                             "never arrived (no answer to a census within 1 s)");
  EXPECT_EQ(t.cls, FailureClass::collective_timeout);
  EXPECT_EQ(t.rank, 1);
  // The rank that went silent first is blamed for a crash.
  AttemptMonitor m({}, 0);
  m.observe({{0, beat(0, 2, 9, 9, "failed", 20)}, {1, beat(1, 2, 5, 5, "train", 10)}}, 20);
  EXPECT_EQ(m.classify_exit(1, 21).rank, 1);
  // ... unless the launcher names the rank that failed.
  AttemptMonitor named({}, 0);
  named.observe({{0, beat(0, 2, 5, 5, "train", 10)}, {1, beat(1, 2, 5, 5, "train", 11)}}, 20);
  named.scan_line("mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).");
  EXPECT_EQ(named.classify_exit(137, 21).rank, 1);
}

TEST(AegisHosts, ReadsSlotsInEveryFormAndMapsRanksBySlot) {
  const fs::path f = fs::temp_directory_path() / ("zaya_hosts_" + std::to_string(::getpid()));
  std::ofstream(f) << "# two nodes\nnode-a slots=2\nnode-b:1\n\nnode-c 3  # big\nnode-d\n";
  const auto hosts = read_hosts(f);
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].slots, 1);
  EXPECT_EQ(hosts[2].slots, 3);
  EXPECT_EQ(hosts[3].slots, 1);
  EXPECT_EQ(host_of_rank(hosts, 0), "node-a");
  EXPECT_EQ(host_of_rank(hosts, 1), "node-a");
  EXPECT_EQ(host_of_rank(hosts, 2), "node-b");
  EXPECT_EQ(host_of_rank(hosts, 5), "node-c");
  EXPECT_EQ(host_of_rank(hosts, 6), "node-d");
  EXPECT_EQ(host_of_rank(hosts, 7), "");
  std::ofstream(f) << "node-a slots=two\n";
  EXPECT_NE(test::error_of([&] { read_hosts(f); }).find("line 1"), std::string::npos);
  std::ofstream(f) << "# nothing\n";
  EXPECT_NE(test::error_of([&] { read_hosts(f); }).find("no host"), std::string::npos);
  fs::remove(f);
}

TEST(AegisCommand, ReplacesResumeAppendsSkipsAndSubstitutesHosts) {
  RestartPlan plan;
  plan.resume = "/runs/x/step_0000010";
  plan.resume_step = 10;
  plan.rewind = true;
  const std::vector<std::string> base = {"mpirun", "-np", "{np}", "--host", "{hosts}", "zaya", "train",
                                         "--config", "c.toml", "--resume", "latest"};
  const auto cmd = build_command(base, plan, {{40, 52}, {80, 84}}, {{"a", 2}, {"b", 1}});
  const std::vector<std::string> want = {"mpirun", "-np", "3", "--host", "a:2,b:1", "zaya", "train", "--config",
                                         "c.toml", "--resume", "/runs/x/step_0000010", "--rewind",
                                         "--skip-samples", "40:52", "--skip-samples", "80:84"};
  EXPECT_EQ(cmd, want);
  // No plan: the command as given (a fresh run).
  EXPECT_EQ(build_command({"zaya", "train", "--config", "c.toml"}, {}, {}, {}),
            (std::vector<std::string>{"zaya", "train", "--config", "c.toml"}));
  EXPECT_EQ(shell_join({"a b", "c", "it's"}), "'a b' c 'it'\\''s'");
}

TEST(AegisState, RoundTripsThroughJsonAndRejectsAMalformedFile) {
  const fs::path dir = fs::temp_directory_path() / ("zaya_state_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(load_state(dir).attempts, 0);  // absent: fresh
  SupervisorState s;
  s.attempts = 3;
  s.restarts = 2;
  s.skip_windows = {{8, 16}};
  s.excluded_hosts = {"node-b"};
  s.host_failures = {{"node-b", 2}};
  Incident i;
  i.cls = "hang";
  i.evidence = "rank 1 silent";
  i.time_to_recover_s = 1.5;
  s.pending = i;
  save_state(dir, s);
  const SupervisorState r = load_state(dir);
  EXPECT_EQ(r.to_json(), s.to_json());
  ASSERT_TRUE(r.pending);
  EXPECT_EQ(*r.pending->time_to_recover_s, 1.5);
  std::ofstream(aegis_dir(dir) / "state.json") << "{\"attempts\": 1}";
  EXPECT_NE(test::error_of([&] { load_state(dir); }).find("state.json"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zaya::aegis
