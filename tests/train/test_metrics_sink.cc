// metrics.jsonl never holds a torn line or a step twice (issue 35, finding 7): a failed write is
// cut back to the last whole record and reported, and a resume drops what it will write again.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/train/progress.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

class MetricsSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zaya_metrics_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "metrics.jsonl").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string contents() const {
    std::ifstream in(path_, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Every line of the file, each of which must be a whole JSON object; the `step` of each.
  std::vector<int64_t> steps() const {
    std::vector<int64_t> out;
    const std::string text = contents();
    EXPECT_TRUE(text.empty() || text.back() == '\n')
        << "torn last line: " << text.substr(text.rfind('\n') + 1);
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
      if (!j.is_discarded()) out.push_back(j.value("step", int64_t{-1}));
    }
    return out;
  }
  fs::path dir_;
  std::string path_;
};

// A record about as large as a training step's (a few hundred bytes).
nlohmann::json record(int64_t step) {
  return {{"step", step}, {"loss", 3.25}, {"padding", std::string(300, 'x')}, {"time", {{"step", 0.5}}}};
}

// A file-size limit makes writes fail as a full disk does: the first write of a record past the
// limit is cut short (a torn line), the next fails outright (EFBIG; SIGXFSZ ignored).
TEST_F(MetricsSinkTest, AFailedWriteLeavesNoTornLineAndIsCounted) {
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  {
    MetricsSink sink(path_, 0);
    for (int s = 1; s <= 3; ++s) sink.write(record(s));
    struct rlimit small = saved;
    small.rlim_cur = fs::file_size(path_) + 100;  // record 4 fits only partly
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    sink.write(record(4));
    sink.write(record(5));
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
    EXPECT_EQ(sink.lost_records(), 2);
    sink.write(record(6));
    EXPECT_EQ(sink.lost_records(), 2);
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2, 3, 6}));
}

// A resume at step 5 after a crash at step 8 (in the middle of a write): the records of steps 6-8
// and the torn line go, those of steps <= 5 (a validation record of step 5 included) stay, and the
// resumed run's records follow on lines of their own.
TEST_F(MetricsSinkTest, ResumeDropsReplayedStepsAndATornTail) {
  {
    MetricsSink sink(path_, 0);
    for (int s = 1; s <= 5; ++s) sink.write(record(s));
    sink.write({{"step", 5}, {"val_loss", 3.0}});
    sink.write({{"event", "phase_start"}, {"step", 6}});
    for (int s = 6; s <= 8; ++s) sink.write(record(s));
  }
  { std::ofstream(path_, std::ios::app) << R"({"step": 9, "loss": 3.)"; }
  {
    MetricsSink sink(path_, 5);
    for (int s = 6; s <= 7; ++s) sink.write(record(s));
  }
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2, 3, 4, 5, 5, 6, 7}));
  // A file that ends in a whole record of the resumed step is left alone; a fresh run (0) starts
  // the file over.
  const std::string before = contents();
  { MetricsSink sink(path_, 7); }
  EXPECT_EQ(contents(), before);
  { MetricsSink sink(path_, 0); }
  EXPECT_EQ(contents(), "");
}

TEST_F(MetricsSinkTest, UnwritableDirectoryIsAnErrorNamingTheFile) {
  try {
    MetricsSink sink((dir_ / "missing" / "metrics.jsonl").string(), 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing/metrics.jsonl"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zaya::train
