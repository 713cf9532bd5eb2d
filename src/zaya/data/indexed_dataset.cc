#include "zaya/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "zaya/core/error.h"

namespace zaya::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D'

template <class T>
T load(const uint8_t* p) {  // unaligned little-endian read (x86 and arm64 are little-endian)
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

Error idx_error(const std::string& file, const std::string& field, const std::string& expected,
                const std::string& found) {
  // zaya::Error formats this as "FILE: FIELD: malformed (expected ..., found ...)".
  return Error("malformed", ErrorContext{.file = file, .field = field, .expected = expected, .found = found});
}

// Maps a whole file read-only. Returns nullptr for an empty file (mmap rejects length 0).
const uint8_t* map_file(const std::string& path, size_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open", ErrorContext{.file = path, .found = std::strerror(errno)});
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("not a regular file", ErrorContext{.file = path});
  }
  *size = static_cast<size_t>(st.st_size);
  if (*size == 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps its own reference to the file
  if (p == MAP_FAILED) throw Error("mmap failed", ErrorContext{.file = path, .found = std::strerror(errno)});
  return static_cast<const uint8_t*>(p);
}

}  // namespace

const char* token_dtype_name(TokenDtype d) { return d == TokenDtype::u16 ? "uint16" : "int32"; }

TokenDtype token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDtype::u16 : TokenDtype::i32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

// ---------------------------------------------------------------------------------------------
// Writer

IndexedDatasetWriter::IndexedDatasetWriter(std::string bin_file, std::string idx_file, TokenDtype dtype)
    : bin_file_(std::move(bin_file)), idx_file_(std::move(idx_file)), dtype_(dtype) {
  bin_.open(bin_file_, std::ios::binary | std::ios::trunc);
  ZAYA_CHECK(bin_.good(), bin_file_, ": cannot open for writing");
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finalized_) return;
  bin_.close();
  std::remove(bin_file_.c_str());
  std::remove(idx_file_.c_str());
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  ZAYA_ASSERT(!finalized_, "add_document after finalize");
  ZAYA_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), bin_file_, ": document of ", tokens.size(),
             " tokens exceeds the int32 length field of the .idx format");
  const int32_t hi = dtype_ == TokenDtype::u16 ? 65535 : INT32_MAX;
  for (int32_t t : tokens)
    ZAYA_CHECK(t >= 0 && t <= hi, bin_file_, ": token id ", t, " does not fit dtype ",
               token_dtype_name(dtype_), " (expected 0..", hi, ")");
  if (dtype_ == TokenDtype::u16) {
    scratch_.assign(tokens.begin(), tokens.end());
    bin_.write(reinterpret_cast<const char*>(scratch_.data()),
               static_cast<std::streamsize>(scratch_.size() * 2));
  } else {
    bin_.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
  }
  ZAYA_CHECK(bin_.good(), bin_file_, ": write failed (disk full?)");
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::finalize() {
  ZAYA_ASSERT(!finalized_, "finalize twice");
  bin_.flush();
  ZAYA_CHECK(bin_.good(), bin_file_, ": write failed (disk full?)");
  bin_.close();
  const uint64_t s = lengths_.size();
  std::string idx;
  idx.reserve(kHeaderBytes + 20 * s + 16);
  idx.append(kMagic, 9);
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, static_cast<uint8_t>(dtype_));
  append<uint64_t>(idx, s);
  append<uint64_t>(idx, s + 1);  // document index entries: one per document plus the end
  for (int32_t n : lengths_) append<int32_t>(idx, n);
  int64_t ptr = 0;
  for (int32_t n : lengths_) {
    append<int64_t>(idx, ptr);
    ptr += static_cast<int64_t>(n) * token_dtype_size(dtype_);
  }
  for (uint64_t d = 0; d <= s; ++d) append<int64_t>(idx, static_cast<int64_t>(d));
  std::ofstream out(idx_file_, std::ios::binary | std::ios::trunc);
  out.write(idx.data(), static_cast<std::streamsize>(idx.size()));
  out.flush();
  ZAYA_CHECK(out.good(), idx_file_, ": write failed");
  finalized_ = true;
}

void write_indexed_dataset(const std::string& prefix, TokenDtype dtype,
                           const std::vector<std::vector<int32_t>>& documents) {
  IndexedDatasetWriter w(bin_path(prefix), idx_path(prefix), dtype);
  for (const auto& d : documents) w.add_document(d);
  w.finalize();
}

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ipath = idx_path(prefix), bpath = bin_path(prefix);
  idx_map_ = map_file(ipath, &idx_size_);
  try {
    // Header: nothing is read past what the file holds, and nothing is sized by its counts until
    // they agree with the file size exactly.
    if (idx_size_ < kHeaderBytes)
      throw idx_error(ipath, "header", str("at least ", kHeaderBytes, " bytes"),
                      str(idx_size_, " bytes (truncated)"));
    if (std::memcmp(idx_map_, kMagic, 9) != 0)
      throw idx_error(ipath, "magic", "\"MMIDIDX\\0\\0\" (a Megatron indexed dataset)", "other bytes");
    const uint64_t version = load<uint64_t>(idx_map_ + 9);
    if (version != 1) throw idx_error(ipath, "version", "1", str(version));
    const uint8_t code = idx_map_[17];
    if (code != 4 && code != 8)
      throw idx_error(ipath, "dtype code", "4 (int32) or 8 (uint16)", str(static_cast<int>(code)));
    dtype_ = static_cast<TokenDtype>(code);
    const uint64_t s = load<uint64_t>(idx_map_ + 18);
    const uint64_t d = load<uint64_t>(idx_map_ + 26);
    const uint64_t body = idx_size_ - kHeaderBytes;
    // Each count alone must fit the file before they are multiplied (no overflow).
    if (s > body / 12)
      throw idx_error(ipath, "sequence count",
                      str("at most ", body / 12, " for a file of ", idx_size_, " bytes"), str(s));
    if (d > body / 8)
      throw idx_error(ipath, "document count",
                      str("at most ", body / 8, " for a file of ", idx_size_, " bytes"), str(d));
    const uint64_t need = kHeaderBytes + 12 * s + 8 * d;
    if (need != idx_size_)
      throw idx_error(
          ipath, "file size", str(need, " bytes for ", s, " sequences and ", d, " document index entries"),
          str(idx_size_, " bytes", idx_size_ == need + s ? " (a multimodal index: not supported)" : ""));
    if (d < 1) throw idx_error(ipath, "document count", "at least 1 (the index starts with 0)", "0");
    num_sequences_ = static_cast<int64_t>(s);
    num_doc_index_ = static_cast<int64_t>(d);
    lengths_ = idx_map_ + kHeaderBytes;
    pointers_ = lengths_ + 4 * s;
    doc_index_ = pointers_ + 8 * s;

    bin_map_ = map_file(bpath, &bin_size_);
    const int isz = token_dtype_size(dtype_);
    // Lengths first: their sum must be exactly the .bin size (a truncated or padded .bin is
    // named as such), accumulated without overflow however large the counts are.
    uint64_t total = 0;
    for (int64_t i = 0; i < num_sequences_; ++i) {
      const int32_t len = sequence_length(i);
      if (len < 0) throw idx_error(ipath, str("lengths[", i, "]"), "a non-negative token count", str(len));
      total += static_cast<uint64_t>(len) * isz;
      if (total > bin_size_) break;
    }
    if (total != bin_size_)
      throw idx_error(
          bpath, "file size",
          str(total > bin_size_ ? "at least " : "", total, " bytes (the lengths in ", ipath, " x ", isz, ")"),
          str(bin_size_, " bytes"));
    int64_t expect_ptr = 0;
    for (int64_t i = 0; i < num_sequences_; ++i) {
      const int32_t len = sequence_length(i);
      const int64_t ptr = sequence_pointer(i);
      if (ptr < 0 || static_cast<uint64_t>(ptr) > bin_size_ ||
          static_cast<uint64_t>(len) * isz > bin_size_ - static_cast<uint64_t>(ptr))
        throw idx_error(ipath, str("pointers[", i, "]"),
                        str("a byte range inside ", bpath, " (", bin_size_, " bytes)"),
                        str("offset ", ptr, " + ", len, " tokens x ", isz, " bytes"));
      if (ptr != expect_ptr)
        throw idx_error(ipath, str("pointers[", i, "]"), str(expect_ptr, " (sequences stored back to back)"),
                        str(ptr));
      expect_ptr += static_cast<int64_t>(len) * isz;
    }
    num_tokens_ = expect_ptr / isz;
    if (document_index(0) != 0) throw idx_error(ipath, "document_indices[0]", "0", str(document_index(0)));
    for (int64_t i = 1; i < num_doc_index_; ++i)
      if (document_index(i) < document_index(i - 1))
        throw idx_error(ipath, str("document_indices[", i, "]"),
                        str(">= ", document_index(i - 1), " (non-decreasing)"), str(document_index(i)));
    if (document_index(num_doc_index_ - 1) != num_sequences_)
      throw idx_error(ipath, str("document_indices[", num_doc_index_ - 1, "]"),
                      str(num_sequences_, " (the sequence count)"), str(document_index(num_doc_index_ - 1)));
  } catch (...) {
    if (idx_map_) ::munmap(const_cast<uint8_t*>(idx_map_), idx_size_);
    if (bin_map_) ::munmap(const_cast<uint8_t*>(bin_map_), bin_size_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(const_cast<uint8_t*>(idx_map_), idx_size_);
  if (bin_map_) ::munmap(const_cast<uint8_t*>(bin_map_), bin_size_);
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  ZAYA_ASSERT(i >= 0 && i < num_sequences_);
  return load<int32_t>(lengths_ + 4 * i);
}
int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  ZAYA_ASSERT(i >= 0 && i < num_sequences_);
  return load<int64_t>(pointers_ + 8 * i);
}
int64_t IndexedDataset::document_index(int64_t i) const {
  ZAYA_ASSERT(i >= 0 && i < num_doc_index_);
  return load<int64_t>(doc_index_ + 8 * i);
}

int32_t IndexedDataset::token(int64_t t) const {
  int32_t v;
  read_tokens(t, 1, &v);
  return v;
}

void IndexedDataset::read_tokens(int64_t first, int64_t count, int32_t* out) const {
  ZAYA_CHECK(first >= 0 && count >= 0 && first + count <= num_tokens_, prefix_, ": tokens [", first, ", ",
             first + count, ") outside the stream of ", num_tokens_, " tokens");
  if (dtype_ == TokenDtype::u16) {
    const uint8_t* p = bin_map_ + 2 * first;
    for (int64_t i = 0; i < count; ++i) out[i] = load<uint16_t>(p + 2 * i);
  } else if (count > 0) {
    std::memcpy(out, bin_map_ + 4 * first, static_cast<size_t>(count) * 4);
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  ZAYA_CHECK(i >= 0 && i < num_sequences_, prefix_, ": sequence ", i, " of ", num_sequences_);
  std::vector<int32_t> out(static_cast<size_t>(sequence_length(i)));
  read_tokens(sequence_pointer(i) / token_dtype_size(dtype_), static_cast<int64_t>(out.size()), out.data());
  return out;
}

std::vector<int32_t> IndexedDataset::document(int64_t i) const {
  ZAYA_CHECK(i >= 0 && i < num_documents(), prefix_, ": document ", i, " of ", num_documents());
  std::vector<int32_t> out;
  for (int64_t s = document_index(i); s < document_index(i + 1); ++s) {
    std::vector<int32_t> seq = sequence(s);
    out.insert(out.end(), seq.begin(), seq.end());
  }
  return out;
}

}  // namespace zaya::data
