// `data prepare`'s input checks: invalid UTF-8 is counted and located (SentencePiece would replace
// it silently), an input with no valid text and an unusable thread count are clear errors instead
// of SentencePiece's internal assertions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "corpus.h"
#include "test_util.h"
#include "zaya/data/prepare.h"

namespace zaya::data {
namespace {
namespace fs = std::filesystem;

TEST(CheckUtf8, CountsAndLocatesEveryInvalidByte) {
  EXPECT_EQ(check_utf8("plain ascii\n").invalid_bytes, 0);
  const Utf8Report ok = check_utf8("na\xC3\xAFve \xE2\x82\xAC \xF0\x9F\x98\x80\n");  // ï, €, 😀
  EXPECT_EQ(ok.invalid_bytes, 0);
  EXPECT_EQ(ok.first_invalid, -1);
  EXPECT_EQ(ok.text_bytes, 2 + 2 + 2 + 3 + 4);  // n a, ï, v e, €, 😀: whitespace is not text
  // Each ill-formed case of Unicode table 3-7 counts its bytes one by one: a stray continuation
  // byte, an overlong 2-byte form, a surrogate, a code point past U+10FFFF, 0xFF, and a sequence
  // cut short by the end of the text.
  const Utf8Report bad = check_utf8("ok\nab\x80 \xC0\xAF \xED\xA0\x80 \xF4\x90\x80\x80 \xFF \xE2\x82");
  EXPECT_EQ(bad.first_invalid, 5);
  EXPECT_EQ(bad.first_line, 2);
  EXPECT_EQ(bad.invalid_bytes, 1 + 2 + 3 + 4 + 1 + 2);
  EXPECT_EQ(bad.text_bytes, 4);  // o k a b
  EXPECT_EQ(check_utf8("\xFF\xFE  \n").text_bytes, 0);
}

class PrepareInputCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(ZAYA_BINARY)) GTEST_SKIP() << "zaya binary not built: " << ZAYA_BINARY;
    dir_ = (fs::temp_directory_path() / "zaya_test_data" /
            ("prep_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/out");
    std::ofstream txt(dir_ + "/corpus.txt");
    for (const auto& p : testing::make_paragraphs(60, 5)) txt << p << "\n";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  zaya::test::CliRun prepare(const std::string& args) {
    return zaya::test::run_zaya("--log-level warn data prepare --vocab 350 --doc-split paragraph --out " + dir_ +
                                "/out/p " + args);
  }
  std::string dir_;
};

TEST_F(PrepareInputCli, WarnsWithTheCountAndFirstPlaceOfInvalidUtf8) {
  std::ofstream(dir_ + "/latin1.txt", std::ios::binary) << "first line\ncaf\xE9 au lait\nna\xEFve\n";
  auto r = prepare("--input " + dir_ + "/corpus.txt " + dir_ + "/latin1.txt");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("data prepare: 2 bytes of invalid UTF-8 in 1 input file(s), the first at " + dir_ +
                          "/latin1.txt byte 14 (line 2)"),
            std::string::npos)
      << r.output;
  std::ifstream stats(dir_ + "/out/p.json");
  const std::string json{std::istreambuf_iterator<char>(stats), {}};
  EXPECT_NE(json.find("\"invalid_utf8_bytes\": 2"), std::string::npos) << json;
  // Valid input: no warning.
  fs::remove_all(dir_ + "/out");
  fs::create_directories(dir_ + "/out");
  r = prepare("--input " + dir_ + "/corpus.txt");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("invalid UTF-8"), std::string::npos) << r.output;
}

// An input of no valid UTF-8 at all failed inside SentencePiece ("Vocabulary size too high",
// blamed on --vocab); --tokenizer-threads 0 failed with SentencePiece's assertion.
TEST_F(PrepareInputCli, NoValidTextAndBadThreadCountsAreClearErrors) {
  {
    std::ofstream bin(dir_ + "/binary.dat", std::ios::binary);
    for (int line = 0; line < 50; ++line) bin << std::string(40, '\xFE') << "\x80\x81\n";
  }
  auto r = prepare("--input " + dir_ + "/binary.dat");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("zaya: error: --input: no valid UTF-8 text in the inputs (2100 invalid bytes, the first at " +
                          dir_ + "/binary.dat byte 0 (line 1)); convert them to UTF-8 first"),
            std::string::npos)
      << r.output;
  for (const char* n : {"0", "-1", "1000"}) {
    r = prepare("--input " + dir_ + "/corpus.txt --tokenizer-threads " + n);
    EXPECT_EQ(r.code, 2) << n << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string("zaya: error: --tokenizer-threads: expected a thread count in [1, ")),
              std::string::npos)
        << r.output;
  }
  EXPECT_TRUE(fs::is_empty(dir_ + "/out"));
}

}  // namespace
}  // namespace zaya::data
