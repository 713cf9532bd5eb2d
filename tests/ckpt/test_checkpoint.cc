// Checkpoint directories: async save + load, resharding, verify, atomic commit under SIGKILL,
// leftover cleanup and retention.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "ckpt_test_util.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/writer.h"

namespace zaya::ckpt {
namespace {

using nlohmann::json;
using test::expect_error;
using test::patterned;
using test::same_bytes;
using test::TempDir;

std::vector<SaveItem> all_dtypes(uint32_t seed) {
  return {{"model.embed_tokens.weight", patterned({6, 4}, DType::bf16, seed + 1), {}, {}},
          {"optim.exp_avg", patterned({5, 3, 2}, DType::f32, seed + 2), {}, {}},
          {"loader.order", patterned({11}, DType::i32, seed + 3), {}, {}},
          {"step_counter", patterned({}, DType::i64, seed + 4), {}, {}},
          {"mask", patterned({13}, DType::u8, seed + 5), {}, {}}};
}

TEST(Checkpoint, AsyncSaveLoadRoundTrip) {
  TempDir dir;
  auto items = all_dtypes(10);
  json state = {{"step", 5}, {"consumed_tokens", 81920}, {"rng", {{"seed", 42}, {"offset", 7}}},
                {"loader", {{"global_sample_index", 640}}}, {"config", {{"model", {{"hidden_size", 64}}}}}};
  {
    CheckpointWriter w(dir.path());
    double stall = w.save(5, items, state);
    EXPECT_GE(stall, 0.0);
    w.wait();
    EXPECT_EQ(w.last_stats().step, 5);
    EXPECT_EQ(w.last_stats().bytes, 6 * 4 * 2 + 5 * 3 * 2 * 4 + 11 * 4 + 8 + 13u);
  }
  EXPECT_EQ(read_latest(dir.path())->filename(), "step_0000005");
  Checkpoint ck(dir.path());  // resolves `latest`
  EXPECT_EQ(ck.manifest().step, 5);
  EXPECT_EQ(ck.manifest().state, state);
  VerifyReport r = ck.verify();
  EXPECT_TRUE(r.ok()) << r.problems.front();
  EXPECT_EQ(r.chunks_checked, items.size());
  for (const auto& it : items) EXPECT_TRUE(same_bytes(ck.load_full(it.name), it.tensor)) << it.name;
  // The rank file is a plain safetensors file.
  SafetensorsFile f(ck.dir() / "rank_00000.safetensors");
  EXPECT_TRUE(same_bytes(f.read("optim.exp_avg"), items[1].tensor));
  // Loading into the wrong dtype or a missing name is a clear error.
  expect_error([&] { ck.load("optim.exp_avg", Tensor::empty({5, 3, 2}, DType::i32)); }, {"stored as F32", "I32"});
  expect_error([&] { ck.load_full("nope"); }, {"tensor not in checkpoint", "nope"});
}

// A float tensor loads into the other float dtype (a GPU run's bf16 weights into f32 and back):
// f32 -> bf16 rounds to nearest even exactly as to_bf16 does, bf16 -> f32 is exact; a box of it too.
TEST(Checkpoint, FloatTensorsLoadAcrossPrecisions) {
  TempDir dir;
  // Values with low mantissa bits set (so the rounding to bf16 matters), no NaNs.
  Tensor f = Tensor::empty({4, 6}, DType::f32), h = Tensor::empty({4, 6}, DType::bf16);
  for (int64_t i = 0; i < 24; ++i) {
    f.data<float>()[i] = (static_cast<float>(i) - 11.3f) * 0.1234567f;
    h.data<bf16>()[i] = to_bf16(static_cast<float>(i) * -0.777f);
  }
  {
    CheckpointWriter w(dir.path());
    w.save(1, {{"f", f, {}, {}}, {"h", h, {}, {}}}, json::object());
    w.wait();
  }
  Checkpoint ck(dir.path());
  Tensor as_bf16 = Tensor::empty({4, 6}, DType::bf16), as_f32 = Tensor::empty({4, 6}, DType::f32);
  ck.load("f", as_bf16);
  ck.load("h", as_f32);
  for (int64_t i = 0; i < 24; ++i) {
    EXPECT_EQ(as_bf16.data<bf16>()[i].bits, to_bf16(f.data<float>()[i]).bits) << i;
    EXPECT_EQ(as_f32.data<float>()[i], to_float(h.data<bf16>()[i])) << i;
  }
  Tensor row = Tensor::empty({1, 6}, DType::bf16);
  ck.load("f", row, {2, 0});
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(row.data<bf16>()[j].bits, to_bf16(f.data<float>()[12 + j]).bits) << j;
}

TEST(Checkpoint, StagingIsASnapshot) {
  // The save returns after the snapshot; changing the tensor afterwards must not change what is
  // written (training continues while the background thread writes).
  TempDir dir;
  Tensor t = patterned({1000}, DType::f32, 3);
  Tensor orig = t.clone();
  CheckpointWriter w(dir.path(), {.test_pause_before_commit_ms = 50});
  w.save(1, {{"t", t, {}, {}}}, json::object());
  t.fill_(0.0);
  w.wait();
  EXPECT_TRUE(same_bytes(Checkpoint(dir.path()).load_full("t"), orig));
  // A second save reuses the staging buffer and commits the new values.
  w.save(2, {{"t", t, {}, {}}}, json::object());
  w.wait();
  EXPECT_TRUE(same_bytes(Checkpoint(dir.path()).load_full("t"), t));
}

// A pause set for the next save (the trainer's kill-during-save injection) leaves the save in flight
// alone: it commits at its own pace. Reading the options live from the background thread made the
// save in flight sleep for the new pause (a 2-rank kill-during-save then hung in the next save).
TEST(Checkpoint, APauseForTheNextSaveLeavesTheSaveInFlightAlone) {
  TempDir dir;
  // The deferred snapshot (the trainer's default) copies 16 MB on the background thread before it
  // writes, so the pause below is set while that save is still in flight.
  Tensor t = patterned({4 << 20}, DType::f32, 4);
  CheckpointWriter w(dir.path(), {.snapshot = Snapshot::deferred});
  w.save(1, {{"t", t, {}, {}}}, json::object());
  w.set_test_pause_before_commit_ms(5000);
  const auto t0 = std::chrono::steady_clock::now();
  w.wait();
  // Without the pause the save takes well under a second here; with it, at least 5 s.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.5);
  EXPECT_EQ(read_latest(dir.path()), dir.path() / "step_0000001");
}

TEST(Checkpoint, BackgroundErrorIsRaisedOnNextCall) {
  TempDir dir;
  CheckpointWriter w(dir.path());
  w.save(3, all_dtypes(1), json::object());
  w.wait();
  w.save(3, all_dtypes(1), json::object());  // same step again: the background commit fails
  expect_error([&] { w.wait(); }, {"step_0000003", "already exists"});
  w.wait();  // the error was consumed
}

// A [10, 6] f32 tensor written as 3 chunks (rows 0-3, 4-6, 7-9) by 3 "ranks", a [4, 9] bf16
// tensor split by columns, and a replicated bias written only by rank 0.
struct ThreeRanks {
  Tensor w = patterned({10, 6}, DType::f32, 100);
  Tensor v = patterned({4, 9}, DType::bf16, 101);
  Tensor b = patterned({6}, DType::f32, 102);
  fs::path save(const fs::path& run_dir, int64_t step) {
    std::vector<std::vector<SaveItem>> ranks(3);
    const int64_t rows[4] = {0, 4, 7, 10};
    const int64_t cols[4] = {0, 2, 5, 9};
    for (int r = 0; r < 3; ++r) {
      ranks[r].push_back({"w", w.slice(rows[r], rows[r + 1]).clone(), {10, 6}, {rows[r], 0}});
      Tensor vc = Tensor::empty({4, cols[r + 1] - cols[r]}, DType::bf16);
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = cols[r]; j < cols[r + 1]; ++j) vc.data<bf16>()[i * vc.size(1) + j - cols[r]] = v.data<bf16>()[i * 9 + j];
      ranks[r].push_back({"v", vc, {4, 9}, {0, cols[r]}});
    }
    ranks[0].push_back({"b", b, {}, {}});
    return save_checkpoint(run_dir, step, ranks, {{"world", 3}});
  }
};

TEST(Checkpoint, ReshardThreeChunksIntoOneTwoAndFourShards) {
  TempDir dir;
  ThreeRanks src;
  fs::path step_dir = src.save(dir.path(), 1);
  Checkpoint ck(step_dir);
  EXPECT_EQ(ck.manifest().world_size, 3);
  EXPECT_EQ(ck.manifest().files.size(), 3u);
  EXPECT_TRUE(ck.verify().ok());
  EXPECT_TRUE(same_bytes(ck.load_full("w"), src.w));
  EXPECT_TRUE(same_bytes(ck.load_full("v"), src.v));
  EXPECT_TRUE(same_bytes(ck.load_full("b"), src.b));
  for (int shards : {1, 2, 4}) {
    // Row sharding as a data-parallel world of `shards` would do it: ceil-divided, last shorter.
    const int64_t per = (10 + shards - 1) / shards;
    for (int s = 0; s < shards; ++s) {
      const int64_t lo = std::min<int64_t>(s * per, 10), hi = std::min<int64_t>(lo + per, 10);
      Tensor dst = Tensor::empty({hi - lo, 6}, DType::f32);
      ck.load("w", dst, {lo, 0});
      EXPECT_TRUE(same_bytes(dst, src.w.slice(lo, hi).clone())) << shards << " shards, shard " << s;
      auto ops = plan_load(ck.tensor("w"), {lo, 0}, {hi - lo, 6}, "w");
      int64_t rows = 0;
      for (const auto& op : ops) rows += op.shape[0];
      EXPECT_EQ(rows, hi - lo) << "the intersections tile the shard";
    }
  }
  // Any hyper-rectangle: rows 1..8, cols 3..8 of the column-chunked tensor (crosses all 3 chunks).
  Tensor box = Tensor::empty({3, 5}, DType::bf16);
  ck.load("v", box, {1, 3});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      EXPECT_EQ(box.data<bf16>()[i * 5 + j].bits, src.v.data<bf16>()[(i + 1) * 9 + j + 3].bits) << i << "," << j;
  EXPECT_EQ(plan_load(ck.tensor("v"), {1, 3}, {3, 5}, "v").size(), 2u) << "cols 3..8 touch chunks [2,5) and [5,9)";
  expect_error([&] { ck.load("w", Tensor::empty({4, 6}, DType::f32), {8, 0}); }, {"outside the stored global extent"});
}

TEST(Checkpoint, CopyBoxThreeDims) {
  // A [3, 4, 5] tensor stored as two chunks split along dim 1, loaded as a box crossing both.
  Tensor g = patterned({3, 4, 5}, DType::i32, 7);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return g.data<int32_t>()[(i * 4 + j) * 5 + k]; };
  TensorEntry t{"I32", {3, 4, 5}, {}};
  t.chunks.push_back({.file = "a", .offsets = {0, 0, 0}, .shape = {3, 1, 5}});
  t.chunks.push_back({.file = "b", .offsets = {0, 1, 0}, .shape = {3, 3, 5}});
  std::vector<std::vector<int32_t>> stored(2);
  for (size_t c = 0; c < 2; ++c)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < t.chunks[c].shape[1]; ++j)
        for (int64_t k = 0; k < 5; ++k) stored[c].push_back(at(i, t.chunks[c].offsets[1] + j, k));
  const std::vector<int64_t> off = {1, 0, 2}, shp = {2, 3, 2};
  std::vector<int32_t> dst(2 * 3 * 2, -1);
  for (const auto& op : plan_load(t, off, shp, "g"))
    copy_box(reinterpret_cast<const std::byte*>(stored[op.chunk].data()), t.chunks[op.chunk].offsets, t.chunks[op.chunk].shape,
             reinterpret_cast<std::byte*>(dst.data()), off, shp, op, 4);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(dst[(i * 3 + j) * 2 + k], at(i + 1, j, k + 2));
}

TEST(Checkpoint, VerifyFindsCorruption) {
  TempDir dir;
  ThreeRanks src;
  fs::path d = src.save(dir.path(), 1);
  auto flip = [](const fs::path& p, uint64_t at) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(at);
    f.write(&c, 1);
  };
  {  // a flipped data byte: the chunk's checksum no longer matches
    Checkpoint ck(d);
    const Chunk& c = ck.tensor("w").chunks[1];
    flip(d / c.file, c.byte_begin + 5);
    Checkpoint again(d);
    VerifyReport r = again.verify();
    ASSERT_EQ(r.problems.size(), 1u);
    EXPECT_NE(r.problems[0].find("checksum mismatch"), std::string::npos) << r.problems[0];
    expect_error([&] { again.load_full("w"); }, {"checksum mismatch", "rank_00001"});
    EXPECT_NO_THROW(again.load_full("v")) << "other tensors stay loadable";
    flip(d / c.file, c.byte_begin + 5);  // undo
    EXPECT_TRUE(Checkpoint(d).verify().ok());
  }
  {  // a truncated rank file
    fs::path f = d / "rank_00002.safetensors";
    const auto size = fs::file_size(f);
    fs::resize_file(f, size - 4);
    VerifyReport r = Checkpoint(d).verify();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.problems[0].find("wrong size"), std::string::npos) << r.problems[0];
    fs::remove(f);
    r = Checkpoint(d).verify();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.problems[0].find("missing"), std::string::npos) << r.problems[0];
  }
}

TEST(Checkpoint, ManifestMissingATensorOrNamingAMissingFile) {
  TempDir dir;
  ThreeRanks src;
  fs::path d = src.save(dir.path(), 1);
  json m = json::parse(read_small_file(d / "manifest.json"));
  json without_b = m;
  without_b["tensors"].erase("b");
  write_file_atomic(d / "manifest.json", without_b.dump());
  VerifyReport r = Checkpoint(d).verify();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.problems[0].find("manifest is missing a tensor"), std::string::npos) << r.problems[0];
  EXPECT_NE(r.problems[0].find("b"), std::string::npos);
  json extra_file = m;
  extra_file["files"].push_back({{"name", "rank_00003.safetensors"}, {"rank", 3}, {"bytes", 100}});
  write_file_atomic(d / "manifest.json", extra_file.dump());
  r = Checkpoint(d).verify();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.problems[0].find("rank_00003.safetensors"), std::string::npos) << r.problems[0];
  expect_error([&] { Checkpoint c(dir.path() / "nowhere"); }, {"no such directory"});
}

TEST(Checkpoint, SaveRejectsChunksThatDoNotCover) {
  TempDir dir;
  std::vector<std::vector<SaveItem>> ranks(1);
  ranks[0].push_back({"w", patterned({2, 3}, DType::f32, 1), {4, 3}, {0, 0}});  // rows 2..3 missing
  expect_error([&] { save_checkpoint(dir.path(), 1, ranks, json::object()); }, {"do not cover", "w"});
  EXPECT_FALSE(fs::exists(dir.path() / "step_0000001")) << "nothing is committed";
  EXPECT_FALSE(read_latest(dir.path()).has_value());
}

TEST(Checkpoint, KillDuringSaveLeavesPreviousCheckpointValid) {
  TempDir dir;
  const fs::path run = dir.path();
  {
    CheckpointWriter w(run);
    w.save(1, all_dtypes(1), {{"step", 1}});
  }
  // Kill the child at several moments of a save of step 2: while it waits between the data and
  // the commit (deterministic: the .tmp file is there), and after a few short delays (wherever
  // it happens to be). Whatever the moment, `latest` must name a checkpoint that verifies.
  for (int delay_ms : {-1, 0, 2, 5, 20}) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        CheckpointWriter w(run, {.test_pause_before_commit_ms = delay_ms < 0 ? 60000 : 0});
        std::vector<SaveItem> big = all_dtypes(2);
        big.push_back({"big", Tensor::zeros({1 << 20}, DType::f32), {}, {}});
        w.save(2, big, {{"step", 2}});
        w.wait();
      } catch (...) {
        _exit(3);
      }
      _exit(0);
    }
    bool started = true;
    if (delay_ms < 0) {
      const fs::path marker = run / "step_0000002.tmp" / "rank_00000.safetensors";
      for (int i = 0; i < 2000 && !fs::exists(marker); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      started = fs::exists(marker);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    }
    kill(pid, SIGKILL);  // before any assertion, so a failing test never leaves the child behind
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(started) << "the child never started writing";
    auto latest = read_latest(run);
    ASSERT_TRUE(latest.has_value());
    Checkpoint ck(run);
    VerifyReport r = ck.verify();
    EXPECT_TRUE(r.ok()) << "delay " << delay_ms << ": " << (r.ok() ? "" : r.problems[0]);
    if (delay_ms < 0) {
      EXPECT_EQ(latest->filename(), "step_0000001") << "killed before the commit: the previous checkpoint stays latest";
      EXPECT_TRUE(fs::exists(run / "step_0000002.tmp"));
    }
    // The next writer clears the debris; if the child got as far as committing, undo that so
    // every iteration starts from the same state.
    CheckpointWriter cleanup(run);
    EXPECT_FALSE(fs::exists(run / "step_0000002.tmp"));
    EXPECT_FALSE(fs::exists(run / "latest.tmp"));
    if (ck.manifest().step == 2 || fs::exists(run / "step_0000002")) {
      fs::remove_all(run / "step_0000002");
      write_file_atomic(run / "latest", "step_0000001\n");
    }
  }
}

TEST(Checkpoint, LeftoverTmpIsRemovedAtStart) {
  TempDir dir;
  fs::create_directories(dir.path() / "step_0000009.tmp");
  std::ofstream(dir.path() / "step_0000009.tmp" / "rank_00000.safetensors") << "partial";
  std::ofstream(dir.path() / "latest.tmp") << "step_00";
  fs::create_directories(dir.path() / "keep_me");
  CheckpointWriter w(dir.path());
  EXPECT_FALSE(fs::exists(dir.path() / "step_0000009.tmp"));
  EXPECT_FALSE(fs::exists(dir.path() / "latest.tmp"));
  EXPECT_TRUE(fs::exists(dir.path() / "keep_me"));
}

TEST(Checkpoint, RewindMovesNewerStepsAside) {
  TempDir dir;
  CheckpointWriter w(dir.path());
  Tensor t = patterned({4}, DType::f32, 1);
  for (int64_t s = 1; s <= 3; ++s) w.save(s, {{"t", t, {}, {}}}, {{"step", s}});
  w.wait();
  expect_error([&] { rewind_to(dir.path(), 7); }, {"no committed checkpoint", "step_0000007"});
  EXPECT_EQ(rewind_to(dir.path(), 1), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read_latest(dir.path())->filename(), "step_0000001");
  EXPECT_EQ(list_steps(dir.path()), (std::vector<int64_t>{1}));
  // Kept, not deleted: both still verify in their folder.
  std::vector<fs::path> folders;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().filename().string().rfind("rewound-", 0) == 0) folders.push_back(e.path());
  ASSERT_EQ(folders.size(), 1u);
  EXPECT_TRUE(Checkpoint(folders[0] / "step_0000002").verify().ok());
  EXPECT_TRUE(Checkpoint(folders[0] / "step_0000003").verify().ok());
  w.save(2, {{"t", t, {}, {}}}, {{"step", 2}});  // the re-run can save step 2 again
  w.wait();
  EXPECT_EQ(read_latest(dir.path())->filename(), "step_0000002");
}

// A resume takes the newest step directory that verifies, whatever `latest` names, and lists the
// newer ones that fail with their problem.
TEST(Checkpoint, ResumePointIsTheNewestThatVerifies) {
  TempDir dir;
  {
    CheckpointWriter w(dir.path(), {.retention = {.keep_last = 10}});
    for (int64_t s = 1; s <= 4; ++s) w.save(s, {{"t", patterned({64}, DType::f32, 1), {}, {}}}, {{"step", s}});
  }
  write_file_atomic(dir.path() / "latest", "step_0000001\n");  // as a kill before `latest` moved leaves it
  fs::resize_file(dir.path() / "step_0000004" / "rank_00000.safetensors", 64);
  fs::remove(dir.path() / "step_0000003" / "manifest.json");
  ResumePoint p = find_resume_point(dir.path());
  EXPECT_EQ(p.dir, dir.path() / "step_0000002");
  EXPECT_EQ(p.step, 2);
  ASSERT_EQ(p.rejected.size(), 2u);
  EXPECT_EQ(p.rejected[0].step, 4);
  EXPECT_NE(p.rejected[0].problem.find("wrong size"), std::string::npos) << p.rejected[0].problem;
  EXPECT_EQ(p.rejected[1].step, 3);
  // A step directory asked for by name is that one, and must verify.
  EXPECT_EQ(find_resume_point(dir.path() / "step_0000001").step, 1);
  expect_error([&] { find_resume_point(dir.path() / "step_0000004"); }, {"fails verification", "step_0000004"});
  expect_error([&] { find_resume_point(dir.path() / "nothing"); }, {"no such directory"});
  fs::create_directories(dir.path() / "empty");
  expect_error([&] { find_resume_point(dir.path() / "empty"); }, {"no checkpoint"});
}

TEST(Checkpoint, LoadFullChecksFilesBeforeAllocating) {
  // A manifest that claims a huge tensor (consistent with itself) must fail on the file check,
  // not by trying to allocate what it claims.
  TempDir dir;
  fs::path d = save_checkpoint(dir.path(), 1, {{{"t", patterned({4}, DType::f32, 1), {}, {}}}}, json::object());
  json m = json::parse(read_small_file(d / "manifest.json"));
  const int64_t huge = int64_t{1} << 40;
  m["tensors"]["t"]["shape"] = {huge};
  m["tensors"]["t"]["chunks"][0]["shape"] = {huge};
  m["tensors"]["t"]["chunks"][0]["byte_end"] = m["tensors"]["t"]["chunks"][0]["byte_begin"].get<int64_t>() + 4 * huge;
  write_file_atomic(d / "manifest.json", m.dump());
  expect_error([&] { Checkpoint(d).load_full("t"); }, {"rank file header disagrees with the manifest"});
}

TEST(Retention, Policy) {
  std::vector<int64_t> steps = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(steps_to_delete(steps, {.keep_last = 2, .keep_every = 4}, std::nullopt),
            (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(steps_to_delete(steps, {.keep_last = 2, .keep_every = 0}, 3),
            (std::vector<int64_t>{1, 2, 4, 5, 6, 7}));
  EXPECT_TRUE(steps_to_delete({1, 2}, {.keep_last = 5}, std::nullopt).empty());
  expect_error([] { steps_to_delete({}, {.keep_last = 0}, std::nullopt); }, {"keep_last"});
}

TEST(Retention, WriterKeepsLastAndEveryNth) {
  TempDir dir;
  CheckpointWriter w(dir.path(), {.retention = {.keep_last = 2, .keep_every = 4}});
  Tensor t = patterned({8}, DType::f32, 1);
  for (int64_t s = 1; s <= 9; ++s) w.save(s, {{"t", t, {}, {}}}, {{"step", s}});
  w.wait();
  EXPECT_EQ(list_steps(dir.path()), (std::vector<int64_t>{4, 8, 9}));
  EXPECT_EQ(read_latest(dir.path())->filename(), "step_0000009");
}

}  // namespace
}  // namespace zaya::ckpt
