#include "zaya/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "ckpt_test_util.h"
#include "zaya/ckpt/checksum.h"

namespace zaya::ckpt {
namespace {

using test::expect_error;
using test::patterned;
using test::same_bytes;
using test::TempDir;

// A file image from a header text and a data buffer of `data_bytes` bytes.
std::vector<std::byte> image(const std::string& header, size_t data_bytes, uint64_t declared_len = UINT64_MAX) {
  uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{7});
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void expect_bad(const std::string& header, size_t data_bytes, std::initializer_list<std::string> parts) {
  auto img = image(header, data_bytes);
  expect_error([&] { parse_safetensors(img, "bad.safetensors"); }, parts);
}

TEST(Crc32c, KnownVectorsAndIncremental) {
  // The standard check value of CRC-32C (RFC 3720 appendix / every CRC catalogue).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // 32 zero bytes: RFC 3720 B.4 test vector.
  std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  std::string s = "the quick brown fox jumps over the lazy dog, twice over and then some";
  for (size_t cut = 0; cut <= s.size(); cut += 7)
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), crc32c(s.data(), s.size()));
  uint32_t c = 0;
  EXPECT_TRUE(parse_checksum(format_checksum(0xdeadbeef), &c));
  EXPECT_EQ(c, 0xdeadbeefu);
  EXPECT_FALSE(parse_checksum("crc32c:DEADBEEF", &c));  // we write lower case only
  EXPECT_FALSE(parse_checksum("xxh64:0123456789abcdef", &c));
}

TEST(Safetensors, RoundTripAllDTypes) {
  TempDir dir;
  std::vector<Tensor> ts = {patterned({3, 5}, DType::f32, 1), patterned({7}, DType::bf16, 2),
                            patterned({2, 2, 3}, DType::i32, 3), patterned({4}, DType::i64, 4),
                            patterned({9}, DType::u8, 5), patterned({0, 4}, DType::f32, 6),
                            patterned({}, DType::f32, 7)};
  std::vector<std::string> names = {"a.f32", "b.bf16", "c.i32", "d.i64", "e.u8", "f.empty", "g.scalar"};
  std::vector<StEntry> entries;
  for (size_t i = 0; i < ts.size(); ++i) entries.push_back(st_entry(names[i], ts[i]));
  auto path = dir.path() / "x.safetensors";
  StWritten w = write_safetensors(path, entries, {{"who", "zaya"}});
  EXPECT_EQ(w.data_start % 8, 0u) << "header must be padded so the data is 8-byte aligned";
  EXPECT_EQ(w.file_bytes, std::filesystem::file_size(path));
  SafetensorsFile f(path);
  EXPECT_EQ(f.header().metadata.at("who"), "zaya");
  ASSERT_EQ(f.header().tensors.size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_TRUE(same_bytes(f.read(names[i]), ts[i])) << names[i];
    // Writer order is data order.
    EXPECT_EQ(f.header().tensors[i].name, names[i]);
  }
  expect_error([&] { f.read("nope"); }, {"no such tensor", "nope"});
}

TEST(Safetensors, OtherDTypesParseButDoNotRead) {
  std::string h = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"d":{"dtype":"F64","shape":[1],"data_offsets":[4,12]}})";
  auto img = image(h, 12);
  StHeader hd = parse_safetensors(img, "hf.safetensors");
  EXPECT_EQ(hd.find("h")->dtype, "F16");
  TempDir dir;
  auto path = dir.path() / "hf.safetensors";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(img.data()), img.size());
  SafetensorsFile f(path);
  expect_error([&] { f.read("h"); }, {"dtype cannot be read", "F16", "h"});
}

TEST(Safetensors, Malformed) {
  // Each case is one way a file can be wrong; the message must say which.
  auto img = image("", 0);
  img.resize(5);
  expect_error([&] { parse_safetensors(img, "short.safetensors"); }, {"short.safetensors", "too short"});
  auto big = image("{}", 0, 100'000'001);
  expect_error([&] { parse_safetensors(big, "big"); }, {"header length too large", "100000000"});
  auto past = image("{}", 0, 1000);
  expect_error([&] { parse_safetensors(past, "past"); }, {"runs past the end"});
  expect_bad("[1, 2]", 0, {"not a JSON object", "'{'"});
  expect_bad("{\"a\": ", 0, {"malformed JSON"});
  const std::string ok = R"("dtype":"F32","shape":[2])";
  expect_bad(R"({"a":{)" + ok + R"(,"data_offsets":[0,9]}})", 8, {"data_offsets out of range", "a.data_offsets"});
  expect_bad(R"({"a":{)" + ok + R"(,"data_offsets":[0,8]},"b":{)" + ok + R"(,"data_offsets":[4,12]}})", 12,
             {"overlaps", "b"});
  expect_bad(R"({"a":{)" + ok + R"(,"data_offsets":[0,8]},"b":{)" + ok + R"(,"data_offsets":[12,20]}})", 20,
             {"hole", "b"});
  expect_bad(R"({"a":{)" + ok + R"(,"data_offsets":[0,8]}})", 12, {"trailing bytes"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, {"shape x dtype", "12 bytes", "8 bytes"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8, {"shape x dtype", "more than 2^64"});
  expect_bad(R"({"a":{)" + ok + R"(,"data_offsets":[0,8]},"a":{)" + ok + R"(,"data_offsets":[8,16]}})", 16,
             {"duplicate key", "a"});
  expect_bad(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8, {"unknown dtype", "Q4"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"non-negative integers", "a.shape"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, {"non-negative integers"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"out of range"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, {"[begin, end]"});
  expect_bad(R"({"a":{"dtype":"F32","shape":[2]}})", 8, {"data_offsets", "nothing"});
  expect_bad(R"({"a":{)" + ok + R"(,"data_offsets":[0,8],"extra":1}})", 8, {"unknown field", "a.extra"});
  expect_bad(R"({"__metadata__":{"k":1}})", 0, {"__metadata__ values must be strings", "__metadata__.k"});
  expect_bad(R"({"a":3})", 0, {"tensor entry must be an object"});
  expect_bad(std::string(200, '[') , 0, {"not a JSON object"});
  expect_bad("{\"a\":" + std::string(200, '['), 0, {"nested too deeply"});
}

TEST(Safetensors, TruncatedFileOnDisk) {
  TempDir dir;
  Tensor t = patterned({64}, DType::f32, 9);
  auto path = dir.path() / "t.safetensors";
  write_safetensors(path, {st_entry("t", t)});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  expect_error([&] { SafetensorsFile f(path); }, {"t.safetensors", "truncated"});
  expect_error([&] { SafetensorsFile f(dir.path() / "missing.safetensors"); }, {"cannot open", "missing.safetensors"});
}

TEST(Safetensors, WriterRejectsInconsistentEntries) {
  TempDir dir;
  float x[2] = {1, 2};
  expect_error([&] { write_safetensors(dir.path() / "w", {{"a", "F32", {3}, x, 8}}); }, {"'a'", "8 bytes"});
  expect_error([&] { write_safetensors(dir.path() / "w", {{"a", "F32", {2}, x, 8}, {"a", "F32", {2}, x, 8}}); },
               {"used twice"});
  expect_error([&] { write_safetensors(dir.path() / "w", {{"a", "Q4", {2}, x, 8}}); }, {"unknown dtype"});
}

}  // namespace
}  // namespace zaya::ckpt
