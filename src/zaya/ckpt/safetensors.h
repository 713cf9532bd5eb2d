// safetensors: a strict reader and a streaming writer (format in shared/REFERENCES.md, "safetensors").
//
// File = u64 little-endian N | N bytes of JSON (an object, padded with spaces) | data buffer.
// The reader trusts nothing: every length and offset is checked against the file's size before
// it is used, so a malformed file gives a zaya::Error naming the file and the field, never a crash
// or an allocation sized by an untrusted number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"

namespace zaya::ckpt {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // what the reference implementation accepts

// Element size of a safetensors dtype name ("BF16" -> 2), or 0 if the name is not one we know.
size_t st_dtype_size(std::string_view name);
// The zaya DType of a safetensors dtype, if zaya computes with it (BF16 F32 I32 I64 U8).
std::optional<DType> st_to_dtype(std::string_view name);
std::string dtype_to_st(DType t);  // DType::bf16 -> "BF16"

struct StTensorInfo {
  std::string name;
  std::string dtype;           // safetensors name, e.g. "F16"
  std::vector<int64_t> shape;  // may have any number of dims (zaya tensors hold at most 5)
  uint64_t begin = 0;          // data_offsets, relative to the data buffer, end exclusive
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct StHeader {
  uint64_t header_bytes = 0;  // N
  uint64_t data_start = 0;    // 8 + N: absolute file offset of the data buffer
  uint64_t data_bytes = 0;    // size of the data buffer
  std::vector<StTensorInfo> tensors;  // in data order (sorted by begin)
  std::map<std::string, std::string> metadata;
  const StTensorInfo* find(std::string_view name) const;
};

// Parses and validates the whole file image `bytes`; `what` names it in errors. Checks: 8-byte
// length, N <= 100 MB and <= size - 8, a JSON object starting with '{', no duplicate keys, known
// dtypes, shapes of non-negative integers, data_offsets that are [begin, end] integers inside the
// buffer and that, sorted, tile it exactly, shape·dtype size == end - begin, __metadata__ a
// string->string object.
StHeader parse_safetensors(std::span<const std::byte> bytes, const std::string& what);

// A read-only memory map of a whole file (empty files map to an empty span).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(ptr_), size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// An opened, validated safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const StHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return file_.path(); }
  // The raw bytes of one tensor; throws naming the tensor if absent.
  std::span<const std::byte> raw(std::string_view name) const;
  // Copies one tensor into a new CPU tensor; throws if the dtype is not a zaya dtype (naming it)
  // or the tensor has more than 5 dims.
  Tensor read(std::string_view name) const;

 private:
  MappedFile file_;
  StHeader header_;
};

// One tensor to write: raw little-endian row-major bytes (not copied; must outlive the call).
struct StEntry {
  std::string name;
  std::string dtype;  // safetensors dtype name
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Where write_safetensors put each entry, as absolute file offsets (same order as the input).
struct StWritten {
  uint64_t data_start = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  uint64_t file_bytes = 0;
};

// Writes entries in the given order to `path` (created or truncated). The header is padded with
// spaces so the data starts 8-byte aligned; data goes out in large writes. With `sync` the file is
// fsynced before returning. Throws zaya::Error on I/O failure or inconsistent entries.
StWritten write_safetensors(const std::filesystem::path& path, const std::vector<StEntry>& entries,
                            const std::map<std::string, std::string>& metadata = {}, bool sync = true);

// Convenience for tests and tools: an StEntry viewing a CPU tensor.
StEntry st_entry(const std::string& name, const Tensor& t);

}  // namespace zaya::ckpt
