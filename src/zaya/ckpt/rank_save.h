// The pieces of a checkpoint save that one rank does, and the commit that joins them.
//
// A checkpoint of W ranks is written by W processes in parallel, each writing only its own rank
// file into run_dir/step_N.tmp/. The processes never talk to each other during the write (the
// background writer and the forked writer must not call MPI: the trainer's main thread is busy with
// collectives and MPI is not initialized for concurrent threads). They coordinate through the file
// system instead (docs/checkpoint-format.md, "Multi-process save"):
//
//   every rank, main:      barrier                                -- every earlier write is finished
//   rank 0, main thread:   prepare_step_dir(run_dir, N)           -- then a barrier on every rank
//   rank r (background):   write_rank_file(step_N.tmp, r, items)  -- rank_r.safetensors, fsynced
//   rank r > 0:            write_chunk_list(step_N.tmp, ...)      -- rank_r.chunks.json, last
//   rank 0 (background):   gather_chunk_lists(step_N.tmp, ...)    -- waits for ranks 1..W-1
//                          compose_manifest(...)                  -- checks the chunks tile every tensor
//                          commit_step_dir(run_dir, N, manifest)  -- manifest.json, rename, latest
//
// A rank that dies before its chunk list leaves step_N.tmp uncommitted: rank 0's gather names it
// after its timeout, `latest` and the previous checkpoint stay as they were, and the next
// prepare_step_dir (or the next writer on rank 0) removes the debris.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
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

std::string rank_file_name(int rank);   // "rank_00000.safetensors"
std::string chunk_list_name(int rank);  // "rank_00001.chunks.json": a rank's report to rank 0
std::string rank_error_name(int rank);  // "rank_00001.error.txt": a rank's failed write, for rank 0

// What one rank wrote: its file, and its chunk of each tensor it holds (in the order of its items).
struct RankChunks {
  int rank = 0;
  FileEntry file;  // name, rank, size in bytes
  struct Item {
    std::string name;
    std::string dtype;                  // safetensors dtype name
    std::vector<int64_t> global_shape;  // the whole tensor's shape
    Chunk chunk;                        // this rank's part: offsets, shape, byte range, CRC32C
  };
  std::vector<Item> items;
  uint64_t tensor_bytes = 0;  // the data bytes of the items (the file adds its header)
};

// Writes `items` as `dir`/rank_file_name(rank) (fsynced) and returns what it wrote. Device tensors
// are copied to the host first. `single_thread`: in a forked child, where only the forking thread
// exists, checksums are computed inline instead of on a helper thread.
RankChunks write_rank_file(const fs::path& dir, int rank, const std::vector<SaveItem>& items, bool single_thread);

// The chunk list as rank r reports it to rank 0: the fields of RankChunks plus the step and the
// world size it was written for, so a list left from another save is never taken for this one.
std::string chunk_list_to_string(const RankChunks& rc, int64_t step, int world_size);
// Strict parse (zaya::Error naming `what` and the field): every field present with the right type,
// no unknown field, the step, world size and rank those expected.
RankChunks parse_chunk_list(std::string_view text, const std::string& what, int64_t step, int world_size, int rank);

// Writes rank r's chunk list into `dir` (the step's .tmp directory) under a temporary name, fsyncs
// it and renames it into place, so rank 0 sees either nothing or the whole list. Call it after the
// rank file is durable (write_rank_file fsyncs it). Works through a descriptor of `dir` opened
// first, so rank 0 renaming `dir` to step_N the moment the list appears cannot fail the rename.
void write_chunk_list(const fs::path& dir, const RankChunks& rc, int64_t step, int world_size);

// A rank other than 0 whose part of the save failed leaves its error message in `dir` for rank 0
// (best effort: nothing is thrown), so rank 0 fails at once with the cause instead of at its timeout.
void write_rank_error(const fs::path& dir, int rank, const std::string& message) noexcept;

// Rank 0: waits until every rank in [1, world_size) has written its chunk list into `dir`, polling
// the file system (no communication), and returns them in rank order. Each list must parse and its
// rank file must exist with the size it reports. A rank that reported an error (write_rank_error)
// fails the gather at once with that error. After `timeout_s` it throws a zaya::Error naming
// every rank whose list never appeared (and whether its rank file is there: a rank that died or
// stalled between its data and its list), the step and the directory.
std::vector<RankChunks> gather_chunk_lists(const fs::path& dir, int64_t step, int world_size, double timeout_s);

// The manifest of step `step` from every rank's chunks (ranks[i].rank == i), with `state` stored
// verbatim. Checks, before anything is committed, that it parses under the reader's rules (every
// tensor has one dtype and global shape on every rank, and its chunks tile it exactly: no hole, no
// overlap); `what` names the manifest in errors.
Manifest compose_manifest(int64_t step, int world_size, const nlohmann::json& state, const std::vector<RankChunks>& ranks,
                          const std::string& what);

// Removes a leftover run_dir/step_N.tmp (a crashed or failed attempt), checks step_N does not exist
// yet, and creates step_N.tmp empty. Rank 0 calls it on its main thread before any rank writes
// into step_N.tmp: the caller orders the two with a barrier (CheckpointWriter does). Returns the
// .tmp directory.
fs::path prepare_step_dir(const fs::path& run_dir, int64_t step);

// The commit: writes manifest.json into step_N.tmp (temporary name, fsync, rename), removes every
// entry the manifest does not list (the chunk lists), fsyncs the directory, renames it to step_N,
// fsyncs run_dir, replaces `latest` atomically and applies `retention`. `quiet`: no logging (a
// forked child, where the log's mutex may have been held by another thread at the fork). Returns
// the committed step directory.
fs::path commit_step_dir(const fs::path& run_dir, const Manifest& m, const RetentionPolicy& retention, bool quiet);

// Waits until run_dir/latest names step `step` or a later one (a rank other than 0 that needs to
// know its save was committed, e.g. at the end of a run), polling the file system. Throws a
// zaya::Error naming the step and what `latest` names after `timeout_s`.
void wait_for_latest(const fs::path& run_dir, int64_t step, double timeout_s);

}  // namespace zaya::ckpt
