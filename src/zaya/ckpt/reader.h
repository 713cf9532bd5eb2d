// Reading checkpoints: open, verify, and load with resharding.
//
// Loading a tensor shard (any hyper-rectangle of the global tensor, e.g. this rank's rows) asks
// the planner which stored chunks intersect it and copies each intersection, so a checkpoint
// written by any number of ranks loads into any other sharding (the PyTorch DCP idea).
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zaya/ckpt/manifest.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/tensor.h"

namespace zaya::ckpt {

namespace fs = std::filesystem;

// One copy of a load: the part of stored chunk `chunk` that falls in the destination shard, as
// a box in global coordinates.
struct CopyOp {
  size_t chunk = 0;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
};

// The chunks of `t` that intersect the box (offsets, shape), with their intersections. Empty
// intersections are skipped. Throws if the box is not inside the global shape.
std::vector<CopyOp> plan_load(const TensorEntry& t, const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& shape, const std::string& name);

// Copies the box `op` (global coordinates) from a chunk stored row-major at `src` (chunk box
// src_offsets/src_shape) into a shard stored row-major at `dst` (box dst_offsets/dst_shape).
void copy_box(const std::byte* src, const std::vector<int64_t>& src_offsets, const std::vector<int64_t>& src_shape,
              std::byte* dst, const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& dst_shape,
              const CopyOp& op, size_t elem_size);

struct VerifyReport {
  std::vector<std::string> problems;  // empty: the checkpoint is complete and every checksum matches
  uint64_t bytes_checked = 0;
  size_t chunks_checked = 0;
  bool ok() const { return problems.empty(); }
};

class Checkpoint {
 public:
  // `dir` is a step directory (holding manifest.json) or a run directory holding `latest`.
  static fs::path resolve(const fs::path& dir);
  explicit Checkpoint(const fs::path& dir);

  const fs::path& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const TensorEntry& tensor(const std::string& name) const;  // throws naming a missing tensor

  // Every rank file present with the listed size and a valid header, every header entry listed
  // in the manifest and agreeing with its chunk, every chunk checksum correct; the manifest's step
  // agreeing with the directory's name and the state's step, and the state's model_config (if
  // any) with the tensors (ckpt/consistency.h).
  VerifyReport verify() const;

  // Fills `dst` (this process's shard, on any device) with the elements of tensor `name` starting
  // at `offsets` in the global tensor (empty: all zeros). A float tensor loads into either float
  // dtype (F32 <-> BF16: bf16 rounded to nearest even, f32 exact), so a GPU run's checkpoint
  // resumes on a CPU and back; other dtypes must match. Chunks are checksummed the first time they
  // are read (when verify_on_load is set).
  void load(const std::string& name, const Tensor& dst, const std::vector<int64_t>& offsets = {}) const;
  // Loads a whole tensor into a new CPU tensor.
  Tensor load_full(const std::string& name) const;
  // Loads the box [offsets, offsets + shape) of tensor `name` (this rank's shard at any world
  // size, e.g. its rows or its range of a flat buffer) into a new CPU tensor of that shape. A box
  // outside the stored global shape is a zaya::Error naming the tensor and the dimension.
  Tensor load_box(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) const;

  bool verify_on_load = true;

 private:
  const SafetensorsFile& file(const std::string& name) const;  // opens and cross-checks lazily
  void check_chunk(const std::string& tensor, size_t chunk_index) const;

  fs::path dir_;
  Manifest manifest_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  mutable std::map<std::pair<std::string, size_t>, bool> verified_;
};

// The checkpoint a resume continues from (docs/checkpoint-format.md, "Recovery rules").
struct ResumePoint {
  fs::path dir;       // the step directory chosen
  int64_t step = 0;   // its step
  struct Rejected {
    int64_t step;
    std::string problem;  // the first thing verification found
  };
  std::vector<Rejected> rejected;  // newer step directories of the run that failed verification, newest first
};

// `where` a step directory (holding manifest.json): that checkpoint, which must verify. A run
// directory: its newest step directory that verifies, whatever `latest` names (a kill after a step
// directory is committed and before `latest` moves leaves `latest` one checkpoint behind); newer
// ones that fail verification are listed in `rejected`. Throws a zaya::Error naming every candidate
// and its problem when none verifies.
ResumePoint find_resume_point(const fs::path& where);

}  // namespace zaya::ckpt
