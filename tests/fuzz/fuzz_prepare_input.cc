// libFuzzer target: the document reader of `zaya data prepare` (data::read_documents, then the
// train/validation split that follows it: cut_single_document for one document, split_documents
// for more) on an arbitrary input file. Any input must end in documents or a zaya::Error; a crash,
// hang, sanitizer report or other exception is a bug. SentencePiece training is not fuzzed here.
//
// Input layout: one mode byte (bit 0: a .jsonl file, else a text file; bit 1: one document per
// blank-line paragraph, else per file), then the file's bytes. The reader takes a path, so the
// bytes are written to a private temporary directory.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "zaya/core/error.h"
#include "zaya/data/prepare.h"

namespace {

// TMPDIR if set, else /dev/shm where it exists: the target writes files on every input, and a
// memory file system keeps that from dominating the time per input.
std::string scratch_root() {
  const char* tmp = std::getenv("TMPDIR");
  if (tmp && *tmp) return tmp;
  return std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
}

const std::string& scratch_dir() {
  static const std::string d = [] {
    std::string dir = scratch_root() + "/zaya_fuzz_prepare_XXXXXX";
    if (!::mkdtemp(dir.data())) __builtin_trap();
    static std::string remove_at_exit;
    remove_at_exit = dir;
    std::atexit([] { std::filesystem::remove_all(remove_at_exit); });
    return dir;
  }();
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool jsonl = data[0] & 1;
  const auto split = (data[0] & 2) ? zaya::data::DocSplit::paragraph : zaya::data::DocSplit::file;
  const std::string path = scratch_dir() + (jsonl ? "/input.jsonl" : "/input.txt");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
    if (!out) __builtin_trap();  // the fuzzer's own scratch space failed, not the reader
  }
  try {
    const auto docs = zaya::data::read_documents(path, split, "text");
    if (docs.empty()) __builtin_trap();  // no documents must be an error, never an empty list
    if (docs.size() == 1) {
      const std::string& t = docs[0].text;
      const auto cut = zaya::data::cut_single_document(t, 0.05, docs[0].source);
      // The cut is a line start strictly inside the text.
      if (cut.byte <= 0 || static_cast<size_t>(cut.byte) >= t.size() || t[cut.byte - 1] != '\n' ||
          cut.line < 2)
        __builtin_trap();
    } else {
      const auto val = zaya::data::split_documents(static_cast<int64_t>(docs.size()), 1234, 0.05);
      bool any_val = false, any_train = false;
      for (bool v : val) (v ? any_val : any_train) = true;
      if (val.size() != docs.size() || !any_val || !any_train) __builtin_trap();
    }
  } catch (const zaya::Error&) {
  }
  return 0;
}
