// Writing checkpoints: the synchronous core (rank files + manifest + atomic commit) and the
// asynchronous CheckpointWriter the trainer uses.
//
// Commit protocol (docs/checkpoint-format.md): everything goes into run_dir/step_N.tmp/; each
// file is fsynced; manifest.json is written last; the directory is fsynced and renamed to
// step_N; run_dir is fsynced; then `latest` is replaced atomically (latest.tmp, fsync, rename).
// A kill at any point leaves the previous checkpoint and `latest` intact; the leftover .tmp is
// removed by the next writer.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/types.h>

#include <future>
#include <thread>
#include <vector>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/manifest.h"
#include "zaya/core/tensor.h"

namespace zaya::ckpt {

// One rank's chunk of one tensor: `tensor` holds the elements of the hyper-rectangle that starts
// at `offsets` in a global tensor of `global_shape` (empty global_shape/offsets: the tensor is
// the whole global tensor).
struct SaveItem {
  std::string name;
  Tensor tensor;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
};

std::string rank_file_name(int rank);  // "rank_00000.safetensors"

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
  int rank = 0;        // this process's rank; a world of one for now
  int world_size = 1;
  // Test hook: sleep this long after the rank files are written and before the manifest and the
  // commit, so a test can kill the process in the middle of a save.
  int test_pause_before_commit_ms = 0;
  Snapshot snapshot = Snapshot::fork;
};

struct SaveStats {
  int64_t step = -1;
  double wait_previous_s = 0;  // blocked on the previous save's background write
  double snapshot_s = 0;       // copying tensors into host staging memory, or the fork()
  bool forked = false;         // the snapshot was a fork (else a copy)
  double stall_s = 0;          // what training lost: wait_previous_s + snapshot_s
  double write_s = 0;          // background: write + fsync + commit
  uint64_t bytes = 0;          // tensor bytes written
  double write_gbps() const { return write_s > 0 ? bytes / write_s / 1e9 : 0; }
};

class CheckpointWriter {
 public:
  // Creates run_dir if needed and removes leftover *.tmp entries from interrupted saves.
  explicit CheckpointWriter(fs::path run_dir, WriterOptions options = {});
  ~CheckpointWriter();  // waits for the write (thread or child) in flight; errors are logged, not thrown
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous save, snapshots `items` (options.snapshot: a fork, or a copy into
  // staging buffers reused between saves) and returns; a child process or a background thread
  // writes and commits. An error from the previous background write is re-raised here (and by poll() as soon as it happens). Returns
  // the stall. With fork, call save() from a thread that outlives the write (the main thread):
  // the child is killed when the thread that forked it exits (PR_SET_PDEATHSIG).
  double save(int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state);
  // Blocks until the save in flight is committed; re-raises its error.
  void wait();
  // Returns at once. When the save in flight has finished, collects it: a success is logged and
  // becomes last_stats(), an error is re-raised now (the trainer calls this at every step
  // boundary, so a failed background save stops training at once, not at the next save).
  void poll();

  const SaveStats& last_stats() const { return last_; }  // of the last completed save
  const fs::path& run_dir() const { return run_dir_; }

  // Deferred snapshots: blocks until the tensors of the save in flight have been copied (returns
  // at once otherwise); returns the seconds it waited. The saved tensors may change afterwards.
  double fence();

 private:
  void join_background();
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
