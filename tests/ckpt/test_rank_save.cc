// The multi-process save's pieces in one process: chunk lists, the manifest composed from every
// rank's, the gather and its errors, the commit, and CheckpointWriter ranks driven from threads
// (the same protocol as one process per rank: the ranks share nothing but the file system).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "ckpt_test_util.h"
#include "rank_test_util.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/rank_save.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/writer.h"

namespace zaya::ckpt {
namespace {

using nlohmann::json;
using test::expect_error;
using test::global_tensors;
using test::patterned;
using test::rank_items;
using test::same_bytes;
using test::TempDir;

// Writes every rank's file of a world into `dir` (already prepared) and returns what each wrote.
std::vector<RankChunks> write_all_ranks(const fs::path& dir, const std::vector<test::GlobalTensor>& set, int world) {
  std::vector<RankChunks> out;
  for (int r = 0; r < world; ++r) out.push_back(write_rank_file(dir, r, rank_items(set, world, r), false));
  return out;
}

TEST(RankSave, ChunkListRoundTripsAndIsParsedStrictly) {
  TempDir dir;
  const RankChunks rc = write_rank_file(dir.path(), 1, rank_items(global_tensors(1), 3, 1), false);
  ASSERT_EQ(rc.items.size(), 4u) << "rank 1 of 3: rows of model.w and optim.flat, the owned momentum, loader rows";
  const std::string text = chunk_list_to_string(rc, 12, 3);
  const RankChunks back = parse_chunk_list(text, "list", 12, 3, 1);
  EXPECT_EQ(back.file.name, "rank_00001.safetensors");
  EXPECT_EQ(back.file.bytes, fs::file_size(dir.path() / "rank_00001.safetensors"));
  EXPECT_EQ(back.tensor_bytes, rc.tensor_bytes);
  ASSERT_EQ(back.items.size(), rc.items.size());
  for (size_t i = 0; i < rc.items.size(); ++i) {
    EXPECT_EQ(back.items[i].name, rc.items[i].name);
    EXPECT_EQ(back.items[i].dtype, rc.items[i].dtype);
    EXPECT_EQ(back.items[i].global_shape, rc.items[i].global_shape);
    EXPECT_EQ(back.items[i].chunk.offsets, rc.items[i].chunk.offsets);
    EXPECT_EQ(back.items[i].chunk.shape, rc.items[i].chunk.shape);
    EXPECT_EQ(back.items[i].chunk.byte_begin, rc.items[i].chunk.byte_begin);
    EXPECT_EQ(back.items[i].chunk.byte_end, rc.items[i].chunk.byte_end);
    EXPECT_EQ(back.items[i].chunk.checksum, rc.items[i].chunk.checksum);
  }
  // A list written for another save, world or rank is never taken for this one.
  expect_error([&] { parse_chunk_list(text, "list", 13, 3, 1); }, {"another save", "step", "13"});
  expect_error([&] { parse_chunk_list(text, "list", 12, 2, 1); }, {"another world size", "world_size"});
  expect_error([&] { parse_chunk_list(text, "list", 12, 3, 2); }, {"another rank", "rank"});
  json j = json::parse(text);
  j["items"][0]["extra"] = 1;
  expect_error([&] { parse_chunk_list(j.dump(), "list", 12, 3, 1); }, {"unknown field", "items[0].extra"});
  j = json::parse(text);
  j["items"][1]["checksum"] = "md5:00";
  expect_error([&] { parse_chunk_list(j.dump(), "list", 12, 3, 1); }, {"malformed checksum", "items[1].checksum"});
  j = json::parse(text);
  j["file"]["name"] = "rank_00000.safetensors";
  expect_error([&] { parse_chunk_list(j.dump(), "list", 12, 3, 1); }, {"another rank's file", "rank_00000"});
  j = json::parse(text);
  j["items"][0]["offsets"][0] = -1;
  expect_error([&] { parse_chunk_list(j.dump(), "list", 12, 3, 1); }, {"items[0].offsets[0]", "[0, 2^62)"});
  expect_error([&] { parse_chunk_list("{\"format\": 1, \"format\": 2}", "list", 12, 3, 1); }, {"list", "format"});
}

TEST(RankSave, ComposedManifestEqualsTheOneProcessSave) {
  // The manifest rank 0 composes from every rank's chunks is the one save_checkpoint writes when
  // one process writes all the rank files: the same bytes, whoever wrote the files.
  TempDir dir;
  const auto set = global_tensors(7);
  const int world = 3;
  std::vector<std::vector<SaveItem>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(rank_items(set, world, r));
  const json state = {{"step", 4}, {"loader", {{"global_sample_index", 96}}}};
  const fs::path one = save_checkpoint(dir.path() / "one", 4, ranks, state);

  const fs::path tmp = prepare_step_dir(dir.path() / "many", 4);
  std::vector<RankChunks> lists = write_all_ranks(tmp, set, world);
  for (int r = 1; r < world; ++r) write_chunk_list(tmp, lists[r], 4, world);
  std::vector<RankChunks> gathered = gather_chunk_lists(tmp, 4, world, 5.0);
  gathered[0] = lists[0];
  const Manifest m = compose_manifest(4, world, state, gathered, "m");
  EXPECT_EQ(manifest_to_string(m), read_small_file(one / "manifest.json"));
  EXPECT_EQ(m.world_size, 3);
  EXPECT_EQ(m.tensors.at("optim.muon.momentum").chunks.size(), 1u);
  EXPECT_EQ(m.tensors.at("optim.muon.momentum").chunks[0].file, "rank_00001.safetensors") << "owned by rank 1";
  EXPECT_EQ(m.tensors.at("loader.order").chunks.size(), 2u) << "held by ranks 0 and 1 only";
  EXPECT_EQ(m.tensors.at("model.w").chunks.size(), 3u);

  const fs::path committed = commit_step_dir(dir.path() / "many", m, {}, false);
  EXPECT_EQ(test::dir_names(committed), test::expected_names(world)) << "the chunk lists are gone";
  EXPECT_EQ(read_latest(dir.path() / "many")->filename(), "step_0000004");
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(read_small_file(committed / rank_file_name(r)), read_small_file(one / rank_file_name(r))) << r;
  Checkpoint ck(committed);
  VerifyReport rep = ck.verify();
  EXPECT_TRUE(rep.ok()) << rep.problems.front();
}

TEST(RankSave, ComposeRejectsDisagreeingRanksAndHoles) {
  TempDir dir;
  auto set = global_tensors(3);
  std::vector<RankChunks> lists = write_all_ranks(dir.path(), set, 2);
  {  // rank 1 says model.w is BF16 where rank 0 says F32
    auto bad = lists;
    for (auto& it : bad[1].items)
      if (it.name == "model.w") it.dtype = "BF16";
    expect_error([&] { compose_manifest(1, 2, json::object(), bad, "m"); },
                 {"model.w", "different dtypes or global shapes", "F32 [10, 6] on rank 0", "BF16 [10, 6] on rank 1"});
  }
  {  // rank 1's rows of model.w are missing: a hole, caught before anything is committed
    auto holed = lists;
    std::erase_if(holed[1].items, [](const RankChunks::Item& it) { return it.name == "model.w"; });
    expect_error([&] { compose_manifest(1, 2, json::object(), holed, "m"); }, {"do not cover", "model.w"});
  }
  expect_error([&] { compose_manifest(1, 3, json::object(), lists, "m"); }, {"2 ranks' chunks for a world of 3"});
}

TEST(RankSave, GatherNamesTheRanksThatNeverReported) {
  TempDir dir;
  const auto set = global_tensors(5);
  const int world = 4;
  std::vector<RankChunks> lists = write_all_ranks(dir.path(), set, world);
  write_chunk_list(dir.path(), lists[1], 9, world);
  fs::remove(dir.path() / rank_file_name(2));  // rank 2 never got to its data; rank 3 stopped after it
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { gather_chunk_lists(dir.path(), 9, world, 0.3); },
               {"step_0000009", "ranks 2, 3 did not report", "within 0.3 s",
                "rank 2: neither its rank file nor its chunk list", "rank 3: its rank file is there but its chunk list is not",
                "`latest` still names the previous checkpoint"});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 5.0) << "bounded by the timeout (plus one poll of at most 50 ms; 5 s for a loaded machine)";

  // A rank that failed says why, and the gather stops at once instead of at its timeout.
  write_rank_error(dir.path(), 3, "disk full");
  expect_error([&] { gather_chunk_lists(dir.path(), 9, world, 600); }, {"rank 3 failed to write its part (disk full)"});

  // A rank file whose size is not what its rank reported (replaced or truncated).
  fs::remove(dir.path() / rank_error_name(3));
  write_chunk_list(dir.path(), lists[3], 9, world);
  fs::resize_file(dir.path() / rank_file_name(3), fs::file_size(dir.path() / rank_file_name(3)) - 1);
  write_rank_file(dir.path(), 2, rank_items(set, world, 2), false);
  write_chunk_list(dir.path(), lists[2], 9, world);
  expect_error([&] { gather_chunk_lists(dir.path(), 9, world, 600); }, {"size differs", "rank_00003.safetensors"});
}

TEST(RankSave, WaitForLatestIsBoundedAndNamesWhatLatestSays) {
  TempDir dir;
  write_file_atomic(dir.path() / "latest", "step_0000003\n");
  EXPECT_NO_THROW(wait_for_latest(dir.path(), 3, 1.0));
  EXPECT_NO_THROW(wait_for_latest(dir.path(), 2, 1.0)) << "a later step counts";
  expect_error([&] { wait_for_latest(dir.path(), 4, 0.1); }, {"step_0000004 was not committed within 0.1 s", "step_0000003"});
}

// Runs rank r's body on its own thread for every r and rethrows the first error; each rank is a
// CheckpointWriter of its own, as in one process per rank.
template <class Body>
std::vector<std::string> run_ranks(int world, Body body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(RankSave, WriterRanksOnThreadsSaveAndReshard) {
  TempDir dir;
  const fs::path run = dir.path() / "run";
  const int world = 3;
  for (Snapshot mode : {Snapshot::copy, Snapshot::deferred}) {
    SCOPED_TRACE(snapshot_name(mode));
    const int64_t step = mode == Snapshot::copy ? 1 : 2;
    const auto set = global_tensors(static_cast<uint32_t>(step * 10));
    std::vector<SaveStats> stats(world);
    auto errors = run_ranks(world, [&](int r) {
      test::FileBarrier barrier(dir.path() / ("barrier" + std::to_string(step)), r, world);
      CheckpointWriter w(run, {.rank = r, .world_size = world, .barrier = std::ref(barrier), .gather_timeout_s = 30,
                               .snapshot = mode});
      std::vector<SaveItem> items = rank_items(set, world, r);
      w.save(step, items, {{"step", step}, {"saved_by", r}});
      w.fence();
      for (auto& it : items) it.tensor.fill_(0.0);  // after the snapshot: must not reach the file
      w.wait_committed(30);
      stats[static_cast<size_t>(r)] = w.last_stats();
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(read_latest(run)->filename(), step_dir_name(step));
    const fs::path d = run / step_dir_name(step);
    EXPECT_EQ(test::dir_names(d), test::expected_names(world));
    Checkpoint ck(d);
    VerifyReport rep = ck.verify();
    EXPECT_TRUE(rep.ok()) << rep.problems.front();
    EXPECT_EQ(ck.manifest().world_size, world);
    EXPECT_EQ(ck.manifest().state["saved_by"], 0) << "rank 0's state is the one stored";
    for (int m : {1, 2, 3, 4})
      for (int r = 0; r < m; ++r) EXPECT_EQ(test::expect_rank_loads(ck, set, m, r), 6);
    for (int r = 0; r < world; ++r) EXPECT_EQ(stats[static_cast<size_t>(r)].step, step);
    EXPECT_GE(stats[0].gather_s, 0.0);
  }
}

TEST(RankSave, WriterOptionsAreChecked) {
  TempDir dir;
  expect_error([&] { CheckpointWriter w(dir.path(), {.rank = 0, .world_size = 2}); }, {"needs WriterOptions::barrier"});
  expect_error([&] { CheckpointWriter w(dir.path(), {.rank = 2, .world_size = 2, .barrier = [] {}}); },
               {"rank 2 is not a rank of a world of 2"});
  expect_error([&] { CheckpointWriter w(dir.path(), {.rank = 0, .world_size = 2, .barrier = [] {}, .gather_timeout_s = 0}); },
               {"gather_timeout_s must be > 0"});
}

TEST(RankSave, OnlyRankZeroClearsDebris) {
  TempDir dir;
  fs::create_directories(dir.path() / "step_0000003.tmp");
  std::ofstream(dir.path() / "step_0000003.tmp" / "rank_00001.safetensors") << "another rank's data, in flight";
  CheckpointWriter w1(dir.path(), {.rank = 1, .world_size = 2, .barrier = [] {}});
  EXPECT_TRUE(fs::exists(dir.path() / "step_0000003.tmp")) << "rank 1 never removes what may be another rank's";
  CheckpointWriter w0(dir.path(), {.rank = 0, .world_size = 2, .barrier = [] {}});
  EXPECT_FALSE(fs::exists(dir.path() / "step_0000003.tmp"));
}

TEST(RankSave, ARanksFailedWriteStopsRankZeroAtOnceWithItsCause) {
  TempDir dir;
  const fs::path run = dir.path() / "run";
  const int world = 2;
  const auto set = global_tensors(1);
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = run_ranks(world, [&](int r) {
    test::FileBarrier barrier(dir.path() / "barrier", r, world);
    CheckpointWriter w(run, {.rank = r, .world_size = world, .barrier = std::ref(barrier), .gather_timeout_s = 60,
                             .snapshot = Snapshot::copy});
    std::vector<SaveItem> items = rank_items(set, world, r);
    if (r == 1) items[0].offsets[0] = 9;  // rows 5..9 placed at 9: outside the global tensor
    w.save(5, items, {{"step", 5}});
    w.wait();
  });
  EXPECT_NE(errors[1].find("lies outside its global extent"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1 failed to write its part"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("lies outside its global extent"), std::string::npos) << errors[0];
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0)
      << "rank 0 did not wait for its 60 s timeout";
  EXPECT_FALSE(read_latest(run).has_value());
  EXPECT_FALSE(fs::exists(run / "step_0000005"));
}

TEST(RankSave, AnExistingStepIsRaisedByRankZerosSaveAndExplainedOnTheOthers) {
  TempDir dir;
  const fs::path run = dir.path() / "run";
  const int world = 2;
  const auto set = global_tensors(1);
  save_checkpoint(run, 5, {rank_items(set, 1, 0)}, {{"step", 5}});
  auto errors = run_ranks(world, [&](int r) {
    test::FileBarrier barrier(dir.path() / "barrier", r, world);
    CheckpointWriter w(run, {.rank = r, .world_size = world, .barrier = std::ref(barrier), .snapshot = Snapshot::copy});
    w.save(5, rank_items(set, world, r), {{"step", 5}});
    w.wait();
  });
  EXPECT_NE(errors[0].find("step_0000005 already exists"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 did not prepare this save"), std::string::npos) << errors[1];
  EXPECT_TRUE(Checkpoint(run).verify().ok()) << "the existing checkpoint is untouched";
}

TEST(RankSave, LoadBoxChecksTheBox) {
  TempDir dir;
  const auto set = global_tensors(2);
  std::vector<std::vector<SaveItem>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(rank_items(set, 2, r));
  Checkpoint ck(save_checkpoint(dir.path(), 1, ranks, json::object()));
  // A box across both ranks' chunks: rows 3..7 of [10, 6] (rank 0 holds 0..4, rank 1 5..9).
  EXPECT_TRUE(same_bytes(ck.load_box("model.w", {3, 0}, {5, 6}), set[0].whole.slice(3, 8).clone()));
  EXPECT_EQ(ck.load_box("model.w", {3, 0}, {0, 6}).numel(), 0) << "an empty shard is a valid box";
  expect_error([&] { ck.load_box("model.w", {8, 0}, {4, 6}); }, {"model.w", "[8, 12) in dim 0", "global extent 10"});
  expect_error([&] { ck.load_box("model.w", {0}, {4}); }, {"model.w", "has 2 dims"});
  expect_error([&] { ck.load_box("nope", {0}, {1}); }, {"tensor not in checkpoint", "nope"});
}

}  // namespace
}  // namespace zaya::ckpt

namespace zaya::ckpt {
namespace {

// A rank's process killed with SIGKILL mid-save (its forked writer goes with it: PR_SET_PDEATHSIG)
// before its chunk list: rank 0, in this process, fails the save naming it, `latest` and the
// previous checkpoint stay, and rank 0's next writer removes the debris.
TEST(RankSave, ARankKilledMidSaveIsNamedAndThePreviousCheckpointStays) {
  TempDir dir;
  const fs::path run = dir.path() / "run";
  const int world = 2;
  {  // step 1, committed by both ranks (on threads: nothing is killed here)
    auto errors = run_ranks(world, [&](int r) {
      test::FileBarrier barrier(dir.path() / "barrier1", r, world);
      CheckpointWriter w(run, {.rank = r, .world_size = world, .barrier = std::ref(barrier), .snapshot = Snapshot::copy});
      w.save(1, rank_items(global_tensors(1), world, r), {{"step", 1}});
      w.wait_committed(30);
    });
    ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << errors[1];
  }
  const pid_t rank1 = fork();
  ASSERT_GE(rank1, 0);
  if (rank1 == 0) {  // rank 1: saves step 2 with a forked writer that holds its chunk list back
    try {
      test::FileBarrier barrier(dir.path() / "barrier2", 1, world);
      CheckpointWriter w(run, {.rank = 1, .world_size = world, .barrier = std::ref(barrier),
                               .test_pause_before_commit_ms = 60000, .snapshot = Snapshot::fork});
      w.save(2, rank_items(global_tensors(2), world, 1), json::object());
      pause();
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  test::FileBarrier barrier(dir.path() / "barrier2", 0, world);
  std::string error;
  bool rank_file_seen = false;
  try {
    CheckpointWriter w(run, {.rank = 0, .world_size = world, .barrier = std::ref(barrier), .gather_timeout_s = 1,
                             .snapshot = Snapshot::copy});
    w.save(2, rank_items(global_tensors(2), world, 0), {{"step", 2}});
    const fs::path theirs = run / "step_0000002.tmp" / rank_file_name(1);
    for (int i = 0; i < 2000 && !rank_file_seen; ++i) {
      rank_file_seen = fs::exists(theirs);
      if (!rank_file_seen) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(rank1, SIGKILL);
    w.wait();
  } catch (const Error& e) {
    error = e.what();
  }
  kill(rank1, SIGKILL);  // whatever happened above, before any assertion: never leave it behind
  int status = 0;
  waitpid(rank1, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(rank_file_seen) << "rank 1 never wrote its data";
  EXPECT_NE(error.find("step_0000002: rank 1 did not report its chunks within 1 s"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1: its rank file is there"), std::string::npos) << error;
  EXPECT_EQ(read_latest(run)->filename(), "step_0000001");
  EXPECT_FALSE(fs::exists(run / "step_0000002"));
  VerifyReport rep = Checkpoint(run).verify();
  EXPECT_TRUE(rep.ok()) << rep.problems.front();
  EXPECT_FALSE(fs::exists(run / "step_0000002.tmp" / chunk_list_name(1))) << "the killed writer never reported";
  CheckpointWriter next(run, {.rank = 0, .world_size = world, .barrier = [] {}});
  EXPECT_FALSE(fs::exists(run / "step_0000002.tmp")) << "the next attempt's writer removes the debris";
}

}  // namespace
}  // namespace zaya::ckpt

namespace zaya::ckpt {
namespace {

// A save of step 5 fails on rank 0 because rank 1 is slow (its write is still going); both save
// step 5 again with other values. Rank 0 must not clear step_5.tmp for the second attempt while
// rank 1's first write still goes into it (its late chunk list would describe other bytes than the
// file that attempt 2 leaves): the barrier before rank 0's prepare orders them, and the committed
// checkpoint holds attempt 2's values and verifies.
TEST(RankSave, ARetriedSaveNeverMixesWithASlowRanksEarlierAttempt) {
  TempDir dir;
  const fs::path run = dir.path() / "run";
  const int world = 2;
  const auto first = global_tensors(50), second = global_tensors(60);
  std::string rank0_first_error;
  auto errors = run_ranks(world, [&](int r) {
    test::FileBarrier barrier(dir.path() / "barrier", r, world);
    if (r == 0) {
      CheckpointWriter w(run, {.rank = 0, .world_size = world, .barrier = std::ref(barrier), .gather_timeout_s = 1,
                               .snapshot = Snapshot::copy});
      w.save(5, rank_items(first, world, 0), {{"step", 5}, {"attempt", 1}});
      try {
        w.wait();
      } catch (const Error& e) {
        rank0_first_error = e.what();
      }
      w.save(5, rank_items(second, world, 0), {{"step", 5}, {"attempt", 2}});
      w.wait();
      return;
    }
    {  // rank 1's first attempt: its chunk list comes 2.5 s after its data, long after rank 0 gave up
      CheckpointWriter slow(run, {.rank = 1, .world_size = world, .barrier = std::ref(barrier),
                                  .test_pause_before_commit_ms = 2500, .snapshot = Snapshot::copy});
      slow.save(5, rank_items(first, world, 1), json::object());
    }  // the destructor waits for that write
    CheckpointWriter w(run, {.rank = 1, .world_size = world, .barrier = std::ref(barrier), .snapshot = Snapshot::copy});
    w.save(5, rank_items(second, world, 1), json::object());
    w.wait_committed(30);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2)) << errors[0] << "\n" << errors[1];
  EXPECT_NE(rank0_first_error.find("rank 1 did not report its chunks within 1 s"), std::string::npos) << rank0_first_error;
  Checkpoint ck(run);
  EXPECT_EQ(ck.manifest().state["attempt"], 2);
  VerifyReport rep = ck.verify();
  EXPECT_TRUE(rep.ok()) << rep.problems.front();
  for (const auto& g : second) EXPECT_TRUE(same_bytes(ck.load_full(g.name), g.whole)) << g.name;
}

}  // namespace
}  // namespace zaya::ckpt
