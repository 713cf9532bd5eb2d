// Writing checkpoints: the synchronous core (rank files + manifest + atomic commit) and the
// asynchronous CheckpointWriter the trainer uses, for a world of one process or one process per rank.
//
// Commit protocol (docs/checkpoint-format.md): everything goes into run_dir/step_N.tmp/; each
// file is fsynced; manifest.json is written last; the directory is fsynced and renamed to
// step_N; run_dir is fsynced; then `latest` is replaced atomically (latest.tmp, fsync, rename).
// A kill at any point leaves the previous checkpoint and `latest` intact; the leftover .tmp is
// removed by the next writer. With one process per rank, each writes its own rank file and a chunk
// list, and rank 0 commits once every list is there (rank_save.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/types.h>

#include <future>
#include <thread>
#include <vector>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/manifest.h"
#include "zaya/ckpt/rank_save.h"
#include "zaya/core/tensor.h"

namespace zaya::ckpt {

// Synchronous save of a checkpoint whose rank files are all written by this process:
// ranks[r] is what rank r holds. Used by CheckpointWriter (one rank) and by tests and tools that
// need several rank files. Returns the committed step directory.
fs::path save_checkpoint(const fs::path& run_dir, int64_t step, const std::vector<std::vector<SaveItem>>& ranks,
                         const nlohmann::json& state, const RetentionPolicy& retention = {});

// How CheckpointWriter::save takes its snapshot of the tensors (docs/checkpoint-format.md):
//   copy: memcpy into reusable host staging memory (multi-threaded), a background thread writes.
//         The stall is the copy (~0.2 s per 2 GiB at ~10 GB/s).
//   fork: fork(); the child shares the parent's memory copy-on-write, writes and commits, and
//         _exit()s; the parent's stall is the fork (page-table copy). Pages the parent writes
//         while the child runs are copied by the kernel on first write, a cost spread over the
//         next training step instead of paid at once. Falls back to copy when fork() fails.
//         Device tensors are copied to the host before the fork.
//   deferred: like copy, but the copy itself runs in the background thread before the write;
//         save() returns at once and the caller must call fence() before it next modifies the
//         saved tensors (the trainer: before the optimizer step, so the copy overlaps the next
//         forward and backward, which only read the parameters).
// All write the same bytes through the same commit code (save_impl).
enum class Snapshot { copy, fork, deferred };
const char* snapshot_name(Snapshot s);
Snapshot parse_snapshot(const std::string& s, const std::string& what);  // "copy" | "fork" | "deferred"

struct WriterOptions {
  RetentionPolicy retention;
  // This process's rank among the `world_size` processes that write each checkpoint together, one
  // process per rank (docs/checkpoint-format.md, "Multi-process save"). Every rank creates its
  // writer on the same run directory and calls save() for the same steps in the same order; each
  // writes only rank_<rank>.safetensors, and rank 0 commits the checkpoint.
  int rank = 0;
  int world_size = 1;
  // Required when world_size > 1: blocks until every rank has called it (e.g.
  // [&comm] { comm.barrier(); }), bounded by a timeout that throws. save() calls it twice on the
  // caller's thread, never from the background write.
  std::function<void()> barrier;
  // Rank 0 of a world > 1: how long its background commit waits for the other ranks' chunk lists
  // before it fails the save, naming the ranks that never reported. Counted from when rank 0's own
  // rank file is written; allow for the slowest rank's write.
  double gather_timeout_s = 600;
  // Test hook: sleep this long after the rank files are written and before the manifest and the
  // commit (a rank other than 0 of a world > 1: before its chunk list), so a test can kill the
  // process in the middle of a save.
  int test_pause_before_commit_ms = 0;
  Snapshot snapshot = Snapshot::fork;
};

struct SaveStats {
  int64_t step = -1;
  double wait_previous_s = 0;  // blocked on the previous save's background write
  double snapshot_s = 0;       // copying tensors into host staging memory, or the fork()
  bool forked = false;         // the snapshot was a fork (else a copy)
  double barrier_s = 0;        // world > 1: the two barriers of save() (rank 0 prepares step_N.tmp between them)
  double stall_s = 0;          // what training lost: wait_previous_s + barrier_s + snapshot_s
  double write_s = 0;          // background: write + fsync (+ on rank 0 the gather and the commit)
  double gather_s = 0;         // rank 0 of a world > 1: waiting for the other ranks' chunk lists (part of write_s)
  uint64_t bytes = 0;          // tensor bytes written
  double write_gbps() const { return write_s > 0 ? bytes / write_s / 1e9 : 0; }
};

class CheckpointWriter {
 public:
  // Creates run_dir if needed; rank 0 removes leftover *.tmp entries from interrupted saves (every
  // rank's writer must exist before any rank's first save, which the barrier in save() ensures).
  explicit CheckpointWriter(fs::path run_dir, WriterOptions options = {});
  ~CheckpointWriter();  // waits for the write (thread or child) in flight; errors are logged, not thrown
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous save, snapshots `items` (options.snapshot: a fork, or a copy into
  // staging buffers reused between saves) and returns; a child process or a background thread
  // writes and commits. An error from the previous background write is re-raised here (and by poll() as soon as it happens). Returns
  // the stall. With fork, call save() from a thread that outlives the write (the main thread):
  // the child is killed when the thread that forked it exits (PR_SET_PDEATHSIG).
  //
  // World > 1: every rank calls save() with its own chunks (SaveItem offsets/global_shape) and the
  // same step; a tensor may be held by any subset of the ranks as long as their chunks tile it.
  // Only rank 0's `state` is stored (other ranks may pass an empty object). Before the snapshot,
  // save() waits for this rank's previous save, calls options.barrier, lets rank 0 clear and create
  // step_N.tmp, and calls options.barrier again, so no rank writes into step_N.tmp before rank 0
  // has removed what a failed attempt left there, and rank 0 never removes a slower rank's files.
  // The background write of a rank other than 0 ends with its chunk list; rank 0's waits for all of
  // them (gather_timeout_s), then writes the manifest and commits. On rank 0 an existing step_N is
  // raised by save() itself. An error of this rank's previous save is raised before the first
  // barrier, so the other ranks wait there until the barrier's timeout: a trainer stops at the
  // poll() that raised it first.
  double save(int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state);
  // Blocks until the save in flight is finished and re-raises its error. Rank 0 (and a world of
  // one): the checkpoint is committed. Another rank: its part is written; see wait_committed.
  void wait();
  // wait(), then on a rank other than 0 of a world > 1 also until `latest` names the last step this
  // writer saved (or a later one): rank 0 committed it. Throws after `timeout_s`. For the end of a
  // run; during training no rank needs to know (rank 0's poll() raises a failed commit).
  void wait_committed(double timeout_s);
  // Returns at once. When the save in flight has finished, collects it: a success is logged and
  // becomes last_stats(), an error is re-raised now (the trainer calls this at every step
  // boundary, so a failed background save stops training at once, not at the next save).
  void poll();

  const SaveStats& last_stats() const { return last_; }  // of the last completed save
  const fs::path& run_dir() const { return run_dir_; }
  // Test and fault-injection hook: WriterOptions::test_pause_before_commit_ms for the saves from
  // now on (a save already in flight keeps its own).
  void set_test_pause_before_commit_ms(int ms) { options_.test_pause_before_commit_ms = ms; }
  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }

  // Deferred snapshots: blocks until the tensors of the save in flight have been copied (returns
  // at once otherwise); returns the seconds it waited. The saved tensors may change afterwards.
  double fence();

 private:
  void join_background();
  double order_ranks(int64_t step);  // world > 1: barrier, rank 0 prepares step_N.tmp, barrier
  void reap_child(bool block = true);  // !block: return at once while the child runs
  bool fork_writer(int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state);

  fs::path run_dir_;
  WriterOptions options_;
  std::shared_ptr<Storage> staging_;
  std::vector<SaveItem> staged_;
  nlohmann::json staged_state_;
  std::thread thread_;
  std::atomic<bool> thread_done_{false};  // the background thread has finished its save
  std::shared_future<void> copied_;  // deferred snapshot: ready once the staging copy is done
  pid_t child_ = -1;    // the forked writer in flight
  int child_pipe_ = -1;  // read end: the child's "ok <bytes> <seconds>" or "err <message>"
  std::exception_ptr error_;
  SaveStats pending_;
  SaveStats last_;
};

}  // namespace zaya::ckpt
