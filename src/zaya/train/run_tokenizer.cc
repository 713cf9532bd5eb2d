#include "zaya/train/run_tokenizer.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "zaya/ckpt/checksum.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/core/error.h"

namespace zaya::train {
namespace fs = std::filesystem;
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read the tokenizer", {.file = path, .field = "data.tokenizer"});
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw Error("read failed", {.file = path, .field = "data.tokenizer"});
  return bytes.str();
}

std::string name_of(const std::string& bytes) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", ckpt::crc32c(bytes.data(), bytes.size()));
  return std::string("tokenizer-") + hex + ".model";
}

}  // namespace

std::string run_tokenizer_name(const std::string& tokenizer) { return name_of(read_file(tokenizer)); }

std::string keep_run_tokenizer(const fs::path& run_dir, const std::string& tokenizer) {
  const std::string bytes = read_file(tokenizer);
  const std::string name = name_of(bytes);
  const fs::path copy = run_dir / name;
  std::error_code ec;
  if (fs::is_regular_file(copy, ec) && fs::file_size(copy, ec) == bytes.size()) return name;
  fs::create_directories(run_dir);
  ckpt::write_file_atomic(copy, bytes);
  return name;
}

}  // namespace zaya::train
