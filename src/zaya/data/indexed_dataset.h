// Megatron-compatible indexed datasets: PREFIX.bin holds raw token ids, PREFIX.idx describes them
// (REFERENCES.md, "Megatron indexed dataset"; docs/data.md). Byte-for-byte the layout that
// megatron-core's IndexedDatasetBuilder writes, so either side reads the other's files.
//
//   .idx (little-endian): "MMIDIDX\0\0" | u64 version = 1 | u8 dtype code | u64 S (sequences)
//        | u64 D' (entries in the document index = documents + 1) | i32 lengths[S]
//        | i64 byte pointers[S] | i64 document index[D'] (0 first, S last, non-decreasing)
//
// We write one sequence per document (what megatron's preprocess_data.py does without sentence
// splitting); the reader accepts any number of sequences per document.
#pragma once

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace zaya::data {

// Megatron's dtype codes. Only these two are written; 6 and 7 mean different floats in different
// forks, and token ids are never floats.
enum class TokenDtype : uint8_t { i32 = 4, u16 = 8 };

inline int token_dtype_size(TokenDtype d) { return d == TokenDtype::u16 ? 2 : 4; }
const char* token_dtype_name(TokenDtype d);  // "uint16" | "int32"
// uint16 when the vocabulary is under 65,500 (megatron's DType.optimal_dtype), else int32.
TokenDtype token_dtype_for_vocab(int64_t vocab_size);

std::string idx_path(const std::string& prefix);  // PREFIX.idx
std::string bin_path(const std::string& prefix);  // PREFIX.bin

// Streams documents to a .bin file and writes the .idx at finalize(). The paths are explicit so a
// caller can write to temporaries and rename at the end (see prepare.cc). If the writer is
// destroyed without finalize() (an exception unwinding), it removes what it wrote.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string bin_file, std::string idx_file, TokenDtype dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document (one sequence). Every id must fit the dtype: [0, 65535] for uint16,
  // [0, 2^31) for int32.
  void add_document(std::span<const int32_t> tokens);
  void finalize();

  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::string bin_file_, idx_file_;
  TokenDtype dtype_;
  std::ofstream bin_;
  std::vector<int32_t> lengths_;
  std::vector<uint16_t> scratch_;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

// Writes PREFIX.bin/.idx in one call (tests, small datasets).
void write_indexed_dataset(const std::string& prefix, TokenDtype dtype,
                           const std::vector<std::vector<int32_t>>& documents);

// A read-only, memory-mapped dataset. The .idx is validated completely before anything is
// allocated by a number read from it: every malformed file is a zaya::Error naming the file and
// the field. The token stream (all sequences in order) is the whole .bin, since the pointers must
// be contiguous, as every Megatron writer makes them.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDtype dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_index_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;  // byte offset into .bin
  int64_t document_index(int64_t i) const;    // i in [0, num_documents()]: first sequence of doc i

  // Token t of the concatenated stream, and a run of them (bounds checked: throws if outside).
  int32_t token(int64_t t) const;
  void read_tokens(int64_t first, int64_t count, int32_t* out) const;
  std::vector<int32_t> sequence(int64_t i) const;
  std::vector<int32_t> document(int64_t i) const;  // all sequences of document i, concatenated

 private:
  std::string prefix_;
  TokenDtype dtype_ = TokenDtype::u16;
  int64_t num_sequences_ = 0, num_doc_index_ = 0, num_tokens_ = 0;
  const uint8_t* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  const uint8_t* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  // Views into the idx mapping. The arrays start at byte 34, so they are not aligned: every read
  // goes through memcpy.
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_index_ = nullptr;
};

}  // namespace zaya::data
