// Checkpoint I/O benchmark (wired to `zaya bench ckpt` by the bench layer): how long a save of
// `size_bytes` takes synchronously, how long training stalls with the async writer, and how both
// compare with the raw sequential write bandwidth of the same directory's file system.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "zaya/ckpt/writer.h"
#include "zaya/core/tensor.h"

namespace zaya::ckpt {

// One CheckpointWriter snapshot mode, measured with two saves.
struct AsyncBenchResult {
  Snapshot snapshot = Snapshot::copy;
  bool forked = false;         // the later save really forked (false: fork failed, copy fallback)
  double first_stall_s = 0;    // the writer's first save (copy: allocates its staging memory)
  double stall_s = 0;          // a later save (steady state): wait for the previous save + snapshot
  double write_s = 0;          // the background part of that save
  // The cost a snapshot may hide in the next training step: one pass that adds 1 to every
  // element of every tensor right after save() returned (fork: each page written is first
  // copied by the kernel, copy-on-write), and the same pass with no save in flight.
  double touch_during_s = 0;
  // Deferred: the read-only pass over every tensor (a forward pass's worth of reading) run between
  // save() and fence(); stall_s is save() plus whatever the fence still waited after it.
  double overlap_read_s = 0;
  double touch_idle_s = 0;
  double hidden_s() const { return touch_during_s - touch_idle_s; }
};

struct CheckpointBenchResult {
  uint64_t bytes = 0;          // tensor bytes per save
  double raw_write_s = 0;      // one file, large writes, then fsync (like dd conv=fsync)
  double sync_save_s = 0;      // save_checkpoint: rank file + manifest + fsyncs + commit
  std::vector<AsyncBenchResult> async;  // one per requested snapshot mode
  double raw_gbps() const { return raw_write_s > 0 ? bytes / raw_write_s / 1e9 : 0; }
  double sync_gbps() const { return sync_save_s > 0 ? bytes / sync_save_s / 1e9 : 0; }
  double gbps(double s) const { return s > 0 ? bytes / s / 1e9 : 0; }
};

// Runs in a fresh subdirectory of `dir` (removed afterwards). `size_bytes` is rounded down to a
// multiple of 4 and split over 8 f32 tensors, like a model's parameters, on `device`: on a GPU the
// saves copy the tensors to the host first (the async writer into page-locked staging), which is
// the stall a GPU run pays against its synchronous save; the write and read passes are ops there.
CheckpointBenchResult benchmark_checkpoint(uint64_t size_bytes, const std::filesystem::path& dir,
                                           const std::vector<Snapshot>& snapshots = {Snapshot::copy, Snapshot::fork},
                                           Device device = Device::cpu);

}  // namespace zaya::ckpt
