// Checkpoint I/O benchmark (wired to `zaya bench ckpt` by the bench layer): how long a save of
// `size_bytes` takes synchronously, how long training stalls with the async writer, and how both
// compare with the raw sequential write bandwidth of the same directory's file system.
#pragma once

#include <cstdint>
#include <filesystem>

namespace zaya::ckpt {

struct CheckpointBenchResult {
  uint64_t bytes = 0;          // tensor bytes per save
  double raw_write_s = 0;      // one file, large writes, then fsync (like dd conv=fsync)
  double sync_save_s = 0;      // save_checkpoint: rank file + manifest + fsyncs + commit
  double async_first_stall_s = 0;  // the writer's first save (allocates its staging memory)
  double async_stall_s = 0;    // a later save (steady state): wait for the previous save + snapshot
  double async_write_s = 0;    // the background part of that save
  double raw_gbps() const { return raw_write_s > 0 ? bytes / raw_write_s / 1e9 : 0; }
  double sync_gbps() const { return sync_save_s > 0 ? bytes / sync_save_s / 1e9 : 0; }
  double async_gbps() const { return async_write_s > 0 ? bytes / async_write_s / 1e9 : 0; }
};

// Runs in a fresh subdirectory of `dir` (removed afterwards). `size_bytes` is rounded down to a
// multiple of 4 and split over 8 f32 tensors, like a model's parameters.
CheckpointBenchResult benchmark_checkpoint(uint64_t size_bytes, const std::filesystem::path& dir);

}  // namespace zaya::ckpt
