// The checkpoint manifest (manifest.json): what a checkpoint holds and where.
//
// Every tensor has a dtype, a global shape and the chunks that hold it; a chunk is a
// hyper-rectangle of the global tensor (offsets + shape) stored in one rank file at a byte range,
// with a checksum. The non-tensor training state (step, RNG, data loader position, schedule,
// config, ...) is one free-form JSON object, `state`, that the trainer fills and reads back.
// Format and commit protocol: docs/checkpoint-format.md.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zaya::ckpt {

constexpr int kManifestFormatVersion = 1;

struct Chunk {
  std::string file;              // rank file name, relative to the checkpoint directory
  std::vector<int64_t> offsets;  // where the chunk starts in the global tensor, one per dim
  std::vector<int64_t> shape;    // the chunk's extent, one per dim
  uint64_t byte_begin = 0;       // absolute byte range in `file` (end exclusive)
  uint64_t byte_end = 0;
  uint32_t checksum = 0;         // CRC32C of those bytes
};

struct TensorEntry {
  std::string dtype;             // safetensors dtype name ("F32", "BF16", ...)
  std::vector<int64_t> shape;    // global shape
  std::vector<Chunk> chunks;     // together they tile the global shape exactly
};

struct FileEntry {
  std::string name;  // "rank_00000.safetensors"
  int rank = 0;
  uint64_t bytes = 0;
};

struct Manifest {
  int format_version = kManifestFormatVersion;
  int64_t step = 0;
  int world_size = 1;
  std::vector<FileEntry> files;
  std::map<std::string, TensorEntry> tensors;  // sorted by name
  nlohmann::json state = nlohmann::json::object();
};

nlohmann::json manifest_to_json(const Manifest& m);
std::string manifest_to_string(const Manifest& m);  // pretty-printed, ends with a newline

// Strict parse: every field present with the right type, no unknown fields (except inside
// `state`), no duplicate keys, chunks inside the global shape, pairwise disjoint and covering it,
// each chunk's byte range equal to its element count × dtype size, each chunk's file listed in
// `files`, at most one chunk per (tensor, file). Throws zaya::Error naming `what` and the field.
Manifest parse_manifest(std::string_view text, const std::string& what);

// Element count of a shape (1 for a scalar); throws if it overflows.
uint64_t shape_numel(const std::vector<int64_t>& shape);

}  // namespace zaya::ckpt
