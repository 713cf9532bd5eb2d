#include "zaya/ckpt/manifest.h"

#include <gtest/gtest.h>

#include "ckpt_test_util.h"

namespace zaya::ckpt {
namespace {

using nlohmann::json;
using test::expect_error;

// A valid manifest: tensor "w" [4, 3] F32 in two row chunks held by two files.
json good() {
  return json::parse(R"({
    "format_version": 1, "step": 7, "world": {"size": 2},
    "files": [{"name": "rank_00000.safetensors", "rank": 0, "bytes": 200},
              {"name": "rank_00001.safetensors", "rank": 1, "bytes": 200}],
    "tensors": {"w": {"dtype": "F32", "shape": [4, 3], "chunks": [
      {"file": "rank_00000.safetensors", "offsets": [0, 0], "shape": [1, 3], "byte_begin": 128, "byte_end": 140, "checksum": "crc32c:00000001"},
      {"file": "rank_00001.safetensors", "offsets": [1, 0], "shape": [3, 3], "byte_begin": 128, "byte_end": 164, "checksum": "crc32c:0000abcd"}]}},
    "state": {"rng": {"seed": 1}, "loader": {"sample": 1234}}
  })");
}

void expect_bad(const json& j, std::initializer_list<std::string> parts) {
  expect_error([&] { parse_manifest(j.dump(), "m.json"); }, parts);
}

TEST(Manifest, RoundTrip) {
  Manifest m = parse_manifest(good().dump(), "m.json");
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.world_size, 2);
  ASSERT_EQ(m.tensors.at("w").chunks.size(), 2u);
  EXPECT_EQ(m.tensors.at("w").chunks[1].checksum, 0xabcdu);
  EXPECT_EQ(m.state["loader"]["sample"], 1234);
  Manifest again = parse_manifest(manifest_to_string(m), "again.json");
  EXPECT_EQ(manifest_to_json(again), manifest_to_json(m));
  EXPECT_EQ(manifest_to_json(m), good());
}

TEST(Manifest, ScalarsAndEmptyTensors) {
  json j = good();
  j["tensors"]["s"] = json::parse(R"({"dtype": "I64", "shape": [], "chunks": [
      {"file": "rank_00000.safetensors", "offsets": [], "shape": [], "byte_begin": 140, "byte_end": 148, "checksum": "crc32c:00000000"}]})");
  j["tensors"]["e"] = json::parse(R"({"dtype": "F32", "shape": [0, 5], "chunks": []})");
  Manifest m = parse_manifest(j.dump(), "m.json");
  EXPECT_EQ(m.tensors.at("s").chunks.size(), 1u);
  EXPECT_EQ(m.tensors.at("e").chunks.size(), 0u);
}

TEST(Manifest, Malformed) {
  json j;
  expect_error([] { parse_manifest("{\"step\": 1, \"step\": 2}", "m.json"); }, {"duplicate key", "step"});
  expect_error([] { parse_manifest("[]", "m.json"); }, {"not a JSON object"});
  expect_error([] { parse_manifest("{", "m.json"); }, {"m.json", "malformed JSON"});
  j = good(); j.erase("tensors");
  expect_bad(j, {"missing field", "tensors"});
  j = good(); j.erase("state");
  expect_bad(j, {"missing field", "state"});
  j = good(); j["step"] = "seven";
  expect_bad(j, {"step", "integer"});
  j = good(); j["step"] = -1;
  expect_bad(j, {"step", "integer"});
  j = good(); j["format_version"] = 2;
  expect_bad(j, {"format version", "found 2"});
  j = good(); j["bogus"] = 1;
  expect_bad(j, {"unknown field", "bogus"});
  j = good(); j["tensors"]["w"]["dtype"] = "F17";
  expect_bad(j, {"unknown dtype", "tensors.w.dtype"});
  j = good(); j["tensors"]["w"]["chunks"][1]["file"] = "rank_00009.safetensors";
  expect_bad(j, {"not listed", "rank_00009"});
  j = good(); j["files"][1]["name"] = "../evil";
  expect_bad(j, {"plain name", "../evil"});
  j = good(); j["tensors"]["w"]["chunks"][1]["offsets"] = {2, 0};
  expect_bad(j, {"outside the tensor's global shape", "chunks[1]"});
  j = good(); j["tensors"]["w"]["chunks"][1]["offsets"] = {0, 0};
  j["tensors"]["w"]["chunks"][1]["byte_end"] = 164;
  expect_bad(j, {"chunks overlap", "chunks[1]"});
  j = good(); j["tensors"]["w"]["chunks"].erase(1);
  expect_bad(j, {"do not cover the tensor", "12 elements", "found 3 elements"});
  j = good(); j["tensors"]["w"]["chunks"][0]["byte_end"] = 139;
  expect_bad(j, {"byte range does not match", "12 bytes"});
  j = good(); j["tensors"]["w"]["chunks"][0]["checksum"] = "md5:00";
  expect_bad(j, {"malformed checksum", "crc32c:"});
  j = good(); j["tensors"]["w"]["chunks"][0]["shape"] = {1};
  expect_bad(j, {"chunk rank differs", "2 dims"});
  j = good(); j["tensors"]["w"]["chunks"][1]["file"] = "rank_00000.safetensors";
  expect_bad(j, {"two chunks of one tensor in the same file"});
  j = good(); j["tensors"]["w"]["shape"] = {4611686018427387903LL, 4611686018427387903LL};
  expect_bad(j, {"tensor too large"});
  j = good(); j["state"] = 3;
  expect_bad(j, {"state", "an object"});
}

}  // namespace
}  // namespace zaya::ckpt
