// `zaya data ...` through the built binary: exit codes, one-line errors, no partial outputs.
// Skips when the binary has not been built (test_data does not depend on the zaya target).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "corpus.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out;  // stdout and stderr together
};
CliRun zaya(const std::string& args) {
  auto r = zaya::test::run_zaya(args);
  return {r.code, r.output};
}

class DataCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(ZAYA_BINARY)) GTEST_SKIP() << "zaya binary not built: " << ZAYA_BINARY;
    // Per test and process: ctest runs the tests of this file in parallel processes.
    dir_ = (fs::temp_directory_path() / "zaya_test_data" /
            ("cli_" + std::to_string(getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/out");
    std::ofstream txt(dir_ + "/corpus.txt");
    for (const auto& p : zaya::data::testing::make_paragraphs(60, 5)) txt << p << "\n";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  bool out_empty() const { return fs::is_empty(dir_ + "/out"); }
  std::string dir_;
};

TEST_F(DataCli, PrepareAndInspect) {
  CliRun r = zaya("--log-level warn data prepare --input " + dir_ +
                  "/corpus.txt --vocab 350 --doc-split paragraph --out " + dir_ + "/out/p");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("unigram baseline:"), std::string::npos) << r.out;
  for (const char* f :
       {"p.model", "p.vocab", "p.json", "p_train.bin", "p_train.idx", "p_val.bin", "p_val.idx"})
    EXPECT_TRUE(fs::exists(dir_ + "/out/" + f)) << f;
  r = zaya("data inspect " + dir_ + "/out/p_train --tokenizer " + dir_ + "/out/p.model");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dtype:     uint16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("text: "), std::string::npos) << r.out;
}

// One text file with the default --doc-split file is one document: prepare cuts its tail off as
// the validation split and says so.
TEST_F(DataCli, PrepareOfOneTextFileSaysHowItSplit) {
  CliRun r = zaya("--log-level warn data prepare --input " + dir_ + "/corpus.txt --vocab 350 --out " + dir_ + "/out/p");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("split:        the input is one document (" + dir_ + "/corpus.txt), so its lines from "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("train:        1 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("val:          1 documents"), std::string::npos) << r.out;
}

TEST_F(DataCli, BadInputsExitTwoWithOneLineAndNoFiles) {
  std::ofstream(dir_ + "/empty.txt").flush();
  const std::string out = " --out " + dir_ + "/out/p";
  for (const std::string& args : {"--input " + dir_ + "/missing.txt --vocab 350" + out,
                                  "--input " + dir_ + "/empty.txt --vocab 350" + out,
                                  "--input " + dir_ + "/corpus.txt --doc-split paragraph --vocab 40000" + out,
                                  "--input " + dir_ + "/corpus.txt --doc-split sentence --vocab 350" + out}) {
    CliRun r = zaya("--log-level warn data prepare " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("zaya: error: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
    EXPECT_TRUE(out_empty()) << args;
  }
}

TEST_F(DataCli, InspectOfAMalformedIndexNamesTheField) {
  std::ofstream(dir_ + "/bad.idx") << "MMIDIDX";
  std::ofstream(dir_ + "/bad.bin").flush();
  CliRun r = zaya("data inspect " + dir_ + "/bad");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("bad.idx: header: malformed"), std::string::npos) << r.out;
}

}  // namespace
