// Shared helpers for the checkpoint tests: temp directories, deterministic tensors, error checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "zaya/core/error.h"
#include "zaya/core/tensor.h"

namespace zaya::ckpt::test {

// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zaya_ckpt_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Bytes that differ from tensor to tensor and element to element (a counter through a mixing
// function), so a misplaced copy never matches by accident.
inline Tensor patterned(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.raw());
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<unsigned char>(x);
  }
  return t;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;  // empty tensors may have no storage
}

// Runs `fn`, expects a zaya::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a zaya::Error containing '" << *parts.begin() << "'";
  } catch (const zaya::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
  }
}

}  // namespace zaya::ckpt::test
