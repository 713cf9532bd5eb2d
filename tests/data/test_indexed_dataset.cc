// Indexed dataset (.bin/.idx): round trips in both dtypes, and every malformed .idx a clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/data/indexed_dataset.h"

namespace zaya::data {
namespace {
namespace fs = std::filesystem;

std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() / "zaya_test_data" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const std::vector<std::vector<int32_t>> kDocs = {{5, 6, 7, 1}, {1}, {9, 65535, 3, 2, 1}, {}, {4, 1}};

// The expected .idx bytes, assembled field by field as REFERENCES.md describes them.
std::string expected_idx(uint8_t code, int isz) {
  std::string s("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { s.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(code);
  put(uint64_t{kDocs.size()});
  put(uint64_t{kDocs.size() + 1});
  for (const auto& d : kDocs) put(static_cast<int32_t>(d.size()));
  int64_t p = 0;
  for (const auto& d : kDocs) put(p), p += static_cast<int64_t>(d.size()) * isz;
  for (size_t i = 0; i <= kDocs.size(); ++i) put(static_cast<int64_t>(i));
  return s;
}

TEST(IndexedDataset, RoundTripUint16ExactBytes) {
  const std::string prefix = temp_dir() + "/ds";
  write_indexed_dataset(prefix, TokenDtype::u16, kDocs);
  EXPECT_EQ(slurp(prefix + ".idx"), expected_idx(8, 2));
  EXPECT_EQ(fs::file_size(prefix + ".bin"), 12u * 2);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), TokenDtype::u16);
  EXPECT_EQ(ds.num_documents(), 5);
  EXPECT_EQ(ds.num_sequences(), 5);
  EXPECT_EQ(ds.num_tokens(), 12);
  for (size_t d = 0; d < kDocs.size(); ++d) EXPECT_EQ(ds.document(static_cast<int64_t>(d)), kDocs[d]);
  EXPECT_EQ(ds.token(6), 65535);  // the uint16 maximum survives (no sign extension)
  std::vector<int32_t> run(4);
  ds.read_tokens(3, 4, run.data());
  EXPECT_EQ(run, (std::vector<int32_t>{1, 1, 9, 65535}));
  EXPECT_THROW(ds.read_tokens(10, 3, run.data()), Error);
}

TEST(IndexedDataset, RoundTripInt32ExactBytes) {
  const std::string prefix = temp_dir() + "/ds";
  std::vector<std::vector<int32_t>> docs = kDocs;
  docs[2][1] = 262271;  // Gemma-3-sized ids need int32
  write_indexed_dataset(prefix, TokenDtype::i32, docs);
  EXPECT_EQ(slurp(prefix + ".idx"), expected_idx(4, 4));
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), TokenDtype::i32);
  for (size_t d = 0; d < docs.size(); ++d) EXPECT_EQ(ds.document(static_cast<int64_t>(d)), docs[d]);
  EXPECT_EQ(ds.sequence_pointer(2), 5 * 4);
}

TEST(IndexedDataset, DtypeForVocab) {
  EXPECT_EQ(token_dtype_for_vocab(8192), TokenDtype::u16);
  EXPECT_EQ(token_dtype_for_vocab(65499), TokenDtype::u16);
  EXPECT_EQ(token_dtype_for_vocab(65500), TokenDtype::i32);
  EXPECT_EQ(token_dtype_for_vocab(262272), TokenDtype::i32);
}

TEST(IndexedDataset, WriterRejectsIdsOutsideTheDtype) {
  const std::string dir = temp_dir();
  IndexedDatasetWriter w(dir + "/x.bin", dir + "/x.idx", TokenDtype::u16);
  std::vector<int32_t> bad = {1, 65536};
  EXPECT_THROW(w.add_document(bad), Error);
  std::vector<int32_t> neg = {-1};
  EXPECT_THROW(w.add_document(neg), Error);
}

TEST(IndexedDataset, UnfinalizedWriterLeavesNothing) {
  const std::string dir = temp_dir();
  {
    IndexedDatasetWriter w(dir + "/x.bin", dir + "/x.idx", TokenDtype::u16);
    std::vector<int32_t> doc = {1, 2};
    w.add_document(doc);
  }
  EXPECT_FALSE(fs::exists(dir + "/x.bin"));
  EXPECT_FALSE(fs::exists(dir + "/x.idx"));
}

// Corrupts a valid dataset with `mutate` and expects an Error whose message holds `field` and the
// file name.
class MalformedIdx : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = temp_dir() + "/ds";
    write_indexed_dataset(prefix_, TokenDtype::u16, kDocs);
    idx_ = slurp(prefix_ + ".idx");
    bin_ = slurp(prefix_ + ".bin");
  }
  void expect_error(const std::string& idx, const std::string& bin, const std::string& field,
                    const std::string& file_suffix = ".idx") {
    spit(prefix_ + ".idx", idx);
    spit(prefix_ + ".bin", bin);
    try {
      IndexedDataset ds(prefix_);
      ADD_FAILURE() << "no error for a malformed dataset (expected field '" << field << "')";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(field), std::string::npos) << msg;
      EXPECT_NE(msg.find(prefix_ + file_suffix), std::string::npos) << msg;
    }
  }
  template <class T>
  std::string with(size_t offset, T value) const {
    std::string s = idx_;
    std::memcpy(s.data() + offset, &value, sizeof(T));
    return s;
  }
  // Offsets: header 34 bytes, lengths at 34, pointers at 34 + 4S, document index at 34 + 12S.
  static constexpr size_t kS = 5, kLen = 34, kPtr = 34 + 4 * kS, kDoc = 34 + 12 * kS;
  std::string prefix_, idx_, bin_;
};

TEST_F(MalformedIdx, Truncated) {
  expect_error(idx_.substr(0, 20), bin_, "header");
  expect_error(idx_.substr(0, idx_.size() - 3), bin_, "file size");
  expect_error("", bin_, "header");
}
TEST_F(MalformedIdx, BadMagic) { expect_error(with<char>(0, 'X'), bin_, "magic"); }
TEST_F(MalformedIdx, BadVersion) { expect_error(with<uint64_t>(9, 2), bin_, "version"); }
TEST_F(MalformedIdx, BadDtypeCode) {
  expect_error(with<uint8_t>(17, 6), bin_, "dtype code");  // float in some forks
  expect_error(with<uint8_t>(17, 0), bin_, "dtype code");
}
TEST_F(MalformedIdx, CountsExceedingTheFile) {
  // Huge counts must be rejected before anything is sized by them (no allocation, no overflow).
  expect_error(with<uint64_t>(18, uint64_t{1} << 62), bin_, "sequence count");
  expect_error(with<uint64_t>(26, ~uint64_t{0}), bin_, "document count");
  expect_error(with<uint64_t>(18, kS + 1), bin_, "file size");
  expect_error(with<uint64_t>(26, 0).substr(0, kDoc), bin_, "document count");  // zero entries
}
TEST_F(MalformedIdx, PointersOutOfRange) {
  expect_error(with<int64_t>(kPtr + 8 * 4, 1000), bin_, "pointers[4]");
  expect_error(with<int64_t>(kPtr + 8 * 1, -2), bin_, "pointers[1]");
  expect_error(with<int64_t>(kPtr + 8 * 2, 12), bin_, "pointers[2]");  // inside the .bin, but leaving a gap
}
TEST_F(MalformedIdx, NegativeLength) {
  std::string s = with<int32_t>(kLen + 4 * 3, -1);
  std::memcpy(s.data() + kLen + 4 * 4, "\x03\0\0\0", 4);  // keep the total right so the length is named
  expect_error(s, bin_, "lengths[3]");
}
TEST_F(MalformedIdx, BinSizeMismatch) {
  expect_error(idx_, bin_.substr(0, bin_.size() - 2), "file size", ".bin");
  expect_error(idx_, bin_ + std::string(2, '\0'), "file size", ".bin");
}
TEST_F(MalformedIdx, DocumentIndices) {
  expect_error(with<int64_t>(kDoc, 1), bin_, "document_indices[0]");
  expect_error(with<int64_t>(kDoc + 8 * 2, 0), bin_, "document_indices[2]");   // decreasing
  expect_error(with<int64_t>(kDoc + 8 * kS, 4), bin_, "document_indices[5]");  // must end at S
}
TEST_F(MalformedIdx, MissingBin) {
  spit(prefix_ + ".idx", idx_);
  fs::remove(prefix_ + ".bin");
  EXPECT_THROW(IndexedDataset ds(prefix_), Error);
}

}  // namespace
}  // namespace zaya::data
