// One process per rank: this test binary runs itself under `mpirun --oversubscribe -np N` (the
// CkptRankChild.* tests run only as such children, rank and world from the launcher), each rank
// saving its chunks with its own CheckpointWriter in every snapshot mode; the parent then loads
// the checkpoints at other world sizes, in-process and as mpirun children of another size, and
// compares every element exactly (resharding copies bytes). The ranks order themselves with a
// barrier through the file system: the checkpoint layer needs no MPI, and its background writes
// never communicate.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "ckpt_test_util.h"
#include "rank_test_util.h"
#include "test_util.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/writer.h"

namespace zaya::ckpt {
namespace {

using nlohmann::json;
using test::global_tensors;
using test::rank_items;
using test::TempDir;

bool is_rank_child() { return std::getenv("ZAYA_CKPT_RANK_CHILD") != nullptr; }

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw Error(str("the rank child needs ", name, " (set by mpirun or the parent test)"));
  return std::atoi(v);
}

struct Launch {
  int rank, world;
  fs::path dir;  // the parent's scratch directory: run/ and barrier directories below it
};

Launch launch() {
  return {env_int("OMPI_COMM_WORLD_RANK"), env_int("OMPI_COMM_WORLD_SIZE"), std::getenv("ZAYA_CKPT_DIR")};
}

const Snapshot kModes[3] = {Snapshot::copy, Snapshot::deferred, Snapshot::fork};
int64_t step_of(Snapshot mode) { return mode == Snapshot::copy ? 1 : mode == Snapshot::deferred ? 2 : 3; }
uint32_t seed_of(int64_t step) { return static_cast<uint32_t>(step * 10); }

// `mpirun -np N` of this binary's test `name` as rank children on `dir`. Each launch keeps its
// OpenMPI session directory under `dir`: two mpiruns starting at once (ctest -j) can otherwise race
// creating the shared /tmp/ompi.<host>.<uid> and one fails with "File exists".
zaya::test::CliRun run_ranks(int np, const std::string& name, const fs::path& dir, const std::string& env = "") {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  fs::create_directories(dir / "ompi");
  return zaya::test::run_shell(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE mpirun --oversubscribe "
      "--mca orte_tmpdir_base " + (dir / "ompi").string() + " -np " + std::to_string(np) +
      " -x ZAYA_CKPT_RANK_CHILD=1 -x ZAYA_CKPT_DIR=" + dir.string() + env + " " + exe +
      " --gtest_color=no --gtest_filter=" + name);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Every rank saves steps 1, 2, 3 with the copy, deferred and fork snapshots, changing its tensors
// right after each snapshot (after fence() for deferred), and waits until rank 0 committed.
TEST(CkptRankChild, SaveEveryMode) {
  if (!is_rank_child()) GTEST_SKIP() << "runs only as an mpirun child of CkptRanks.*";
  const Launch l = launch();
  for (Snapshot mode : kModes) {
    const int64_t step = step_of(mode);
    test::FileBarrier barrier(l.dir / ("barrier_save" + std::to_string(step)), l.rank, l.world);
    CheckpointWriter w(l.dir / "run", {.retention = {.keep_last = 10}, .rank = l.rank, .world_size = l.world,
                                       .barrier = std::ref(barrier), .gather_timeout_s = 30, .snapshot = mode});
    std::vector<SaveItem> items = rank_items(global_tensors(seed_of(step)), l.world, l.rank);
    w.save(step, items, l.rank == 0 ? json{{"step", step}, {"world", l.world}} : json::object());
    w.fence();
    for (auto& it : items) it.tensor.fill_(0.0);
    w.wait_committed(30);
    EXPECT_EQ(w.last_stats().forked, mode == Snapshot::fork);
    EXPECT_GT(w.last_stats().bytes, 0u);
  }
}

// Each rank of this world loads its row shards of every step's tensors and compares them exactly.
TEST(CkptRankChild, LoadMyShards) {
  if (!is_rank_child()) GTEST_SKIP() << "runs only as an mpirun child of CkptRanks.*";
  const Launch l = launch();
  for (Snapshot mode : kModes) {
    const int64_t step = step_of(mode);
    Checkpoint ck(l.dir / "run" / step_dir_name(step));
    EXPECT_EQ(test::expect_rank_loads(ck, global_tensors(seed_of(step)), l.world, l.rank), 6);
  }
}

// What every CkptRanks test checks of the three checkpoints in the parent: committed with exactly
// their files, verified (in-process and by `zaya ckpt verify`), and loaded at worlds of 1 to 4.
void check_written(const fs::path& run, int world) {
  ASSERT_TRUE(read_latest(run).has_value());
  EXPECT_EQ(read_latest(run)->filename(), "step_0000003");
  for (Snapshot mode : kModes) {
    SCOPED_TRACE(snapshot_name(mode));
    const fs::path d = run / step_dir_name(step_of(mode));
    ASSERT_TRUE(fs::exists(d / "manifest.json"));
    EXPECT_EQ(test::dir_names(d), test::expected_names(world));
    Checkpoint ck(d);
    EXPECT_EQ(ck.manifest().world_size, world);
    EXPECT_EQ(ck.manifest().state, (json{{"step", step_of(mode)}, {"world", world}}));
    VerifyReport rep = ck.verify();
    EXPECT_TRUE(rep.ok()) << rep.problems.front();
    const auto set = global_tensors(seed_of(step_of(mode)));
    for (const auto& g : set) EXPECT_TRUE(test::same_bytes(ck.load_full(g.name), g.whole)) << g.name;
    for (int m = 1; m <= 4; ++m)
      for (int r = 0; r < m; ++r) test::expect_rank_loads(ck, set, m, r);
    const zaya::test::CliRun v = zaya::test::run_zaya("ckpt verify " + d.string());
    EXPECT_EQ(v.code, 0) << v.output;
    EXPECT_NE(v.output.find("OK"), std::string::npos) << v.output;
  }
  const zaya::test::CliRun i = zaya::test::run_zaya("ckpt inspect " + run.string());
  EXPECT_EQ(i.code, 0) << i.output;
  EXPECT_NE(i.output.find(str("world size   ", world)), std::string::npos) << i.output;
}

TEST(CkptRanks, TwoRanksWriteEveryModeThreeRanksLoad) {
  if (is_rank_child()) GTEST_SKIP() << "the parent of CkptRankChild.*";
  TempDir dir;
  const zaya::test::CliRun w = run_ranks(2, "CkptRankChild.SaveEveryMode", dir.path());
  ASSERT_EQ(w.code, 0) << w.output;
  EXPECT_EQ(count(w.output, "[  PASSED  ] 1 test."), 2u) << w.output;
  check_written(dir.path() / "run", 2);
  const zaya::test::CliRun l = run_ranks(3, "CkptRankChild.LoadMyShards", dir.path());
  EXPECT_EQ(l.code, 0) << l.output;
  EXPECT_EQ(count(l.output, "[  PASSED  ] 1 test."), 3u) << l.output;
}

TEST(CkptRanks, ThreeRanksWriteEveryModeTwoRanksLoad) {
  if (is_rank_child()) GTEST_SKIP() << "the parent of CkptRankChild.*";
  TempDir dir;
  const zaya::test::CliRun w = run_ranks(3, "CkptRankChild.SaveEveryMode", dir.path());
  ASSERT_EQ(w.code, 0) << w.output;
  EXPECT_EQ(count(w.output, "[  PASSED  ] 1 test."), 3u) << w.output;
  check_written(dir.path() / "run", 3);
  const zaya::test::CliRun l = run_ranks(2, "CkptRankChild.LoadMyShards", dir.path());
  EXPECT_EQ(l.code, 0) << l.output;
  EXPECT_EQ(count(l.output, "[  PASSED  ] 1 test."), 2u) << l.output;
}

// Three ranks save step 1; then, saving step 2, rank 2 ends its process after its rank file and
// before its chunk list (a rank dying mid-save). Rank 0 must fail the save naming rank 2 after
// its gather timeout, rank 1's part is written but never committed, and `latest` stays step 1.
// With ZAYA_CKPT_RETRY set, every rank saves step 2 again (the restarted run's next attempt).
TEST(CkptRankChild, DieMidSave) {
  if (!is_rank_child()) GTEST_SKIP() << "runs only as an mpirun child of CkptRanks.*";
  const Launch l = launch();
  const bool retry = std::getenv("ZAYA_CKPT_RETRY") != nullptr;
  const fs::path run = l.dir / "run";
  test::FileBarrier barrier(l.dir / (retry ? "barrier_retry" : "barrier_first"), l.rank, l.world);
  const bool dies = !retry && l.rank == 2;
  const WriterOptions o{.rank = l.rank, .world_size = l.world, .barrier = std::ref(barrier), .gather_timeout_s = 30,
                        .snapshot = Snapshot::copy};
  if (!retry) {
    CheckpointWriter first(run, o);
    first.save(1, rank_items(global_tensors(1), l.world, l.rank), l.rank == 0 ? json{{"step", 1}} : json::object());
    first.wait_committed(30);
  }
  WriterOptions o2 = o;
  o2.test_pause_before_commit_ms = dies ? 60000 : 0;  // rank 2 holds its chunk list back
  if (!retry) o2.gather_timeout_s = 2;  // rank 1's list comes within milliseconds; rank 2's never
  CheckpointWriter w(run, o2);
  w.save(2, rank_items(global_tensors(2), l.world, l.rank), l.rank == 0 ? json{{"step", 2}} : json::object());
  if (dies) {
    const fs::path mine = run / "step_0000002.tmp" / rank_file_name(2);
    for (int i = 0; i < 2000 && !fs::exists(mine); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::cout << "rank 2 exits mid-save" << std::endl;
    ::_exit(0);  // no destructors, no chunk list: its writer thread vanishes with it
  }
  if (retry) {
    w.wait_committed(30);
    return;
  }
  if (l.rank == 0) {
    std::string error;
    try {
      w.wait();
    } catch (const Error& e) {
      error = e.what();
    }
    std::cout << "rank 0 error: " << error << std::endl;
    EXPECT_NE(error.find("step_0000002: rank 2 did not report its chunks within 2 s"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 2: its rank file is there but its chunk list is not"), std::string::npos) << error;
  } else {
    w.wait();  // rank 1's part is written; the commit never comes
    std::string error;
    try {
      w.wait_committed(0.5);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("step_0000002 was not committed"), std::string::npos) << error;
  }
}

TEST(CkptRanks, ARankDyingMidSaveLeavesThePreviousCheckpoint) {
  if (is_rank_child()) GTEST_SKIP() << "the parent of CkptRankChild.*";
  TempDir dir;
  const fs::path run = dir.path() / "run";
  const zaya::test::CliRun r = run_ranks(3, "CkptRankChild.DieMidSave", dir.path());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 2 exits mid-save"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint save of step_0000002: rank 2 did not report"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "[  PASSED  ] 1 test."), 2u) << "ranks 0 and 1 pass:\n" << r.output;
  ASSERT_TRUE(read_latest(run).has_value()) << r.output;
  EXPECT_EQ(read_latest(run)->filename(), "step_0000001");
  EXPECT_FALSE(fs::exists(run / "step_0000002"));
  VerifyReport rep = Checkpoint(run).verify();
  EXPECT_TRUE(rep.ok()) << rep.problems.front();
  // The debris: ranks 1 and 2 wrote their data, only rank 1 its chunk list, nobody a manifest.
  const fs::path tmp = run / "step_0000002.tmp";
  EXPECT_TRUE(fs::exists(tmp / rank_file_name(2)));
  EXPECT_TRUE(fs::exists(tmp / chunk_list_name(1)));
  EXPECT_FALSE(fs::exists(tmp / chunk_list_name(2)));
  EXPECT_FALSE(fs::exists(tmp / "manifest.json"));

  // The next attempt (a restarted run) clears the debris and commits step 2.
  const zaya::test::CliRun again = run_ranks(3, "CkptRankChild.DieMidSave", dir.path(), " -x ZAYA_CKPT_RETRY=1");
  EXPECT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(count(again.output, "[  PASSED  ] 1 test."), 3u) << again.output;
  ASSERT_TRUE(read_latest(run).has_value()) << again.output;
  EXPECT_EQ(read_latest(run)->filename(), "step_0000002");
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(test::dir_names(run / "step_0000002"), test::expected_names(3));
  Checkpoint ck(run);
  EXPECT_TRUE(ck.verify().ok());
  for (const auto& g : global_tensors(2)) EXPECT_TRUE(test::same_bytes(ck.load_full(g.name), g.whole)) << g.name;
}

}  // namespace
}  // namespace zaya::ckpt
