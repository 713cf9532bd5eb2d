// libFuzzer target: the Megatron indexed-dataset reader (data::IndexedDataset) on an arbitrary
// .idx/.bin pair. Any pair must end in a dataset whose every token is readable or a zaya::Error; a
// crash, hang, sanitizer report or other exception is a bug.
//
// Input layout: u16 little-endian n | n bytes of .bin | the rest is the .idx. (n is taken modulo
// what is left, so every input splits.) The reader memory-maps files, so both parts are written to
// a private temporary directory first.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/data/indexed_dataset.h"

namespace {

// TMPDIR if set, else /dev/shm where it exists: the target writes files on every input, and a
// memory file system keeps that from dominating the time per input.
std::string scratch_root() {
  const char* tmp = std::getenv("TMPDIR");
  if (tmp && *tmp) return tmp;
  return std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
}

const std::string& prefix() {
  static const std::string p = [] {
    std::string dir = scratch_root() + "/zaya_fuzz_idx_XXXXXX";
    if (!::mkdtemp(dir.data())) __builtin_trap();
    static std::string remove_at_exit;
    remove_at_exit = dir;
    std::atexit([] { std::filesystem::remove_all(remove_at_exit); });
    return dir + "/ds";
  }();
  return p;
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) __builtin_trap();  // the fuzzer's own scratch space failed, not the reader
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t rest = size - 2;
  const size_t bin_bytes = (data[0] | (size_t{data[1]} << 8)) % (rest + 1);
  write(zaya::data::bin_path(prefix()), data + 2, bin_bytes);
  write(zaya::data::idx_path(prefix()), data + 2 + bin_bytes, rest - bin_bytes);
  try {
    zaya::data::IndexedDataset ds(prefix());
    // What an accepted index promises: the sequences tile the .bin, documents tile the sequences,
    // and every token of every document reads back through both access paths.
    const int64_t n = ds.num_tokens();
    if (n < 0 || static_cast<size_t>(n) * zaya::data::token_dtype_size(ds.dtype()) != bin_bytes)
      __builtin_trap();
    std::vector<int32_t> all(static_cast<size_t>(n));
    ds.read_tokens(0, n, all.data());
    int64_t seen = 0;
    for (int64_t d = 0; d < ds.num_documents(); ++d) {
      for (int32_t t : ds.document(d)) {
        if (seen >= n || t != all[static_cast<size_t>(seen)]) __builtin_trap();
        if (ds.dtype() == zaya::data::TokenDtype::u16 && (t < 0 || t > 65535)) __builtin_trap();
        ++seen;
      }
    }
    if (seen != n) __builtin_trap();
    // Reads past the end are user errors, not crashes.
    try {
      ds.token(n);
      __builtin_trap();
    } catch (const zaya::Error&) {
    }
  } catch (const zaya::Error&) {
  }
  return 0;
}
