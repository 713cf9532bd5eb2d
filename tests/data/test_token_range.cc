// Token ids checked against the vocabulary at start (data/token_range.h): the range scan, its
// sidecar cache, the error naming file, sequence and position; and `zaya eval` using it, plus
// eval's bound on --samples (one epoch) and on the sequence length (max_position_embeddings).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/data/indexed_dataset.h"
#include "zaya/data/token_range.h"

namespace zaya::data {
namespace {
namespace fs = std::filesystem;
using zaya::test::error_of;

std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() / "zaya_test_data" /
                 (std::string(info->test_suite_name()) + "." + info->name() + "." + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void set_mtime(const std::string& path, time_t seconds) {
  const struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

TEST(TokenRange, ScanFindsTheSmallestAndLargestId) {
  const std::string p = temp_dir() + "/d";
  write_indexed_dataset(p, TokenDtype::u16, {{5, 6, 7, 1}, {1}, {9, 65535, 3}});
  const TokenRange r = token_range(IndexedDataset(p));
  EXPECT_EQ(r.min_id, 1);
  EXPECT_EQ(r.max_id, 65535);
  EXPECT_FALSE(r.from_cache);
  write_indexed_dataset(p, TokenDtype::i32, {{}, {}});
  const TokenRange empty = token_range(IndexedDataset(p));
  EXPECT_LT(empty.max_id, empty.min_id);  // no tokens
}

// The scan runs in chunks across threads: an extreme id in the last partial chunk is still found.
TEST(TokenRange, ScanCoversEveryChunk) {
  const std::string p = temp_dir() + "/d";
  std::vector<int32_t> big(200003, 7);
  big.back() = 40000;
  big[65536] = 2;
  write_indexed_dataset(p, TokenDtype::u16, {big});
  const TokenRange r = token_range(IndexedDataset(p));
  EXPECT_EQ(r.min_id, 2);
  EXPECT_EQ(r.max_id, 40000);
}

// A bad id used to surface only when a batch reached it, inside the embedding, naming neither file
// nor sample: the check at start names the .bin, the first bad sequence, its document, the
// position, the id and the count.
TEST(TokenRange, CheckNamesFileSequencePositionAndCount) {
  const std::string p = temp_dir() + "/d";
  write_indexed_dataset(p, TokenDtype::u16, {{1, 2, 3}, {4, 99, 5, 100}, {6}});
  EXPECT_EQ(error_of([&] { check_token_range(p, 101); }), "");
  const std::string e = error_of([&] { check_token_range(p, 50); });
  EXPECT_NE(e.find(p + ".bin: sequence 1 (document 1), token 1: id 99 is outside the model's vocabulary [0, 50); 2 of "
                       "the dataset's 8 tokens are (ids 1..100)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("set model.vocab_size to at least 101"), std::string::npos) << e;
  // Negative ids (possible in int32 datasets from other writers; ours refuses them) are out of
  // range too: the last id is patched to -4 in the .bin.
  write_indexed_dataset(p, TokenDtype::i32, {{1}, {2, 3}});
  {
    std::fstream bin(bin_path(p), std::ios::in | std::ios::out | std::ios::binary);
    const int32_t minus4 = -4;
    bin.seekp(8);
    bin.write(reinterpret_cast<const char*>(&minus4), 4);
  }
  const std::string neg = error_of([&] { check_token_range(p, 50); });
  EXPECT_NE(neg.find("sequence 1 (document 1), token 1: id -4 is outside"), std::string::npos) << neg;
}

// A document of several sequences (what megatron writes with sentence splitting): the error names
// the document that holds the offending sequence.
TEST(TokenRange, CheckNamesTheDocumentOfTheSequence) {
  const std::string p = temp_dir() + "/d";
  write_indexed_dataset(p, TokenDtype::u16, {{1}, {2}, {3}, {77}});
  // Rewrite the document index to [0, 2, 4]: documents {seq 0, 1} and {seq 2, 3}.
  std::fstream idx(idx_path(p), std::ios::in | std::ios::out | std::ios::binary);
  idx.seekp(18);
  const uint64_t s = 4, d = 3;
  idx.write(reinterpret_cast<const char*>(&s), 8);
  idx.write(reinterpret_cast<const char*>(&d), 8);
  idx.close();
  fs::resize_file(idx_path(p), 34 + 12 * 4 + 8 * 3);
  std::fstream idx2(idx_path(p), std::ios::in | std::ios::out | std::ios::binary);
  idx2.seekp(34 + 12 * 4);
  for (int64_t v : {int64_t{0}, int64_t{2}, int64_t{4}}) idx2.write(reinterpret_cast<const char*>(&v), 8);
  idx2.close();
  const std::string e = error_of([&] { check_token_range(p, 10); });
  EXPECT_NE(e.find("sequence 3 (document 1), token 0: id 77"), std::string::npos) << e;
}

// Large datasets keep the range in PREFIX.token_range keyed by the files' sizes and mtimes; a
// change to the .bin invalidates it. (cache_min_bytes = 0 turns the cache on for small data.)
TEST(TokenRange, SidecarCacheIsUsedOnlyWhileTheFilesAreUnchanged) {
  const std::string p = temp_dir() + "/d";
  write_indexed_dataset(p, TokenDtype::u16, {{1, 2, 3}, {4, 5}});
  set_mtime(bin_path(p), 1000000000);
  TokenRange r = token_range(IndexedDataset(p), 0);
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(r.max_id, 5);
  ASSERT_TRUE(fs::exists(token_range_cache_path(p)));
  r = token_range(IndexedDataset(p), 0);
  EXPECT_TRUE(r.from_cache);
  EXPECT_EQ(r.min_id, 1);
  EXPECT_EQ(r.max_id, 5);
  // The same sizes, new content and mtime: the sidecar no longer matches and is rewritten.
  write_indexed_dataset(p, TokenDtype::u16, {{1, 2, 3}, {4, 9}});
  set_mtime(bin_path(p), 1000000001);
  r = token_range(IndexedDataset(p), 0);
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(r.max_id, 9);
  EXPECT_TRUE(token_range(IndexedDataset(p), 0).from_cache);
  // A malformed sidecar is ignored (and replaced).
  std::ofstream(token_range_cache_path(p), std::ios::trunc) << "zaya token range v1\nbin_bytes x\n";
  r = token_range(IndexedDataset(p), 0);
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(r.max_id, 9);
}

// Below the size threshold nothing is written beside the data (tests and small corpora).
TEST(TokenRange, SmallDatasetsWriteNoSidecar) {
  const std::string p = temp_dir() + "/d";
  write_indexed_dataset(p, TokenDtype::u16, {{1, 2, 3}});
  check_token_range(p, 10);
  EXPECT_FALSE(fs::exists(token_range_cache_path(p)));
}

// ---------------------------------------------------------------------------------------------
// `zaya eval` through the binary.

struct EvalCli : ::testing::Test {
  void SetUp() override {
    if (!fs::exists(ZAYA_BINARY)) GTEST_SKIP() << "zaya binary not built: " << ZAYA_BINARY;
    dir_ = temp_dir();
    std::ofstream(dir_ + "/tiny.toml")
        << "[model]\nvocab_size = 96\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n"
           "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 2\nmoe_intermediate_size = 32\n"
           "router_hidden_size = 16\nmax_position_embeddings = 64\n";
    auto r = zaya::test::run_zaya("--threads 1 forward --init-config " + dir_ + "/tiny.toml --seed 3 --save-hf " +
                                  dir_ + "/hf");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  zaya::test::CliRun eval(const std::string& args) {
    return zaya::test::run_zaya("--threads 1 eval --ckpt " + dir_ + "/hf " + args);
  }
  std::string dir_;
};

TEST_F(EvalCli, RejectsOutOfVocabularyDataAtStartNamingFileAndSequence) {
  std::vector<std::vector<int32_t>> docs(3, std::vector<int32_t>(40, 7));
  docs[2][17] = 200;  // the model's vocabulary is 96
  write_indexed_dataset(dir_ + "/bad", TokenDtype::u16, docs);
  auto r = eval("--data " + dir_ + "/bad --seq 8 --samples 2 --batch 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("zaya: error: " + dir_ + "/bad.bin: sequence 2 (document 2), token 17: id 200 is outside the "
                          "model's vocabulary [0, 96)"),
            std::string::npos)
      << r.output;
}

// --samples beyond the validation set used to wrap into a second epoch silently (repeating
// sequences); it is now clamped to one epoch with a warning, and the last batch may be partial.
TEST_F(EvalCli, SamplesBeyondTheDatasetAreClampedToOneEpoch) {
  std::vector<int32_t> doc(41);  // (41 - 1) / 8 = 5 samples of 8 tokens
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((i * 37) % 96);
  write_indexed_dataset(dir_ + "/val", TokenDtype::u16, {doc});
  auto over = eval("--data " + dir_ + "/val --seq 8 --samples 64 --batch 2");
  ASSERT_EQ(over.code, 0) << over.output;
  EXPECT_NE(over.output.find("eval: --samples 64 is more than the 5 sequences of 8 tokens in " + dir_ +
                             "/val; evaluating each of them once"),
            std::string::npos)
      << over.output;
  EXPECT_NE(over.output.find("tokens      40 (5 sequences of 8)"), std::string::npos) << over.output;
  // The same five sequences in one full batch: the same mean loss (a different batching only
  // reorders float sums; the printout has 4 decimals, so 2e-4 allows one rounding step either way).
  auto whole = eval("--data " + dir_ + "/val --seq 8 --samples 5 --batch 5");
  ASSERT_EQ(whole.code, 0) << whole.output;
  auto loss_of = [](const std::string& out) {
    const size_t at = out.find("loss        ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 12));
  };
  EXPECT_GT(loss_of(whole.output), 0) << whole.output;
  EXPECT_NEAR(loss_of(over.output), loss_of(whole.output), 2e-4) << over.output << whole.output;
}

// eval ran sequences longer than the model's max_position_embeddings without a word.
TEST_F(EvalCli, SequenceLengthIsBoundedByMaxPositionEmbeddings) {
  write_indexed_dataset(dir_ + "/val", TokenDtype::u16, {std::vector<int32_t>(200, 5)});
  auto r = eval("--data " + dir_ + "/val --seq 65 --samples 1 --batch 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--seq: 65 positions exceed the model's max_position_embeddings (64)"), std::string::npos)
      << r.output;
  EXPECT_EQ(eval("--data " + dir_ + "/val --seq 64 --samples 1 --batch 1").code, 0);
}

}  // namespace
}  // namespace zaya::data
