// Integration: the real `zaya` binary under `mpirun --oversubscribe` (2, 3 and 4 ranks on this
// 2-core machine). Checks the nccl-tests format, that every element validates (#wrong 0), that a
// corrupted element is counted, that bad flags exit 2, and that a rank that dies or hangs is named
// by the survivors within the timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "zaya/dist/collective_math.h"

namespace zaya::dist {
namespace {

struct Proc {
  int rc = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

Proc sh(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun run = test::run_shell(cmd);
  return {run.code, run.output, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// OpenMPI refuses root without these (scripts/env.sh sets them too; the test must not depend on it).
const std::string kEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
std::string mpirun(int np, const std::string& extra = "") {
  return kEnv + "mpirun --oversubscribe " + extra + " -np " + std::to_string(np) + " ";
}
std::string zaya() { return ZAYA_BINARY; }

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}
std::vector<std::string> fields(const std::string& l) {
  std::vector<std::string> v;
  std::istringstream in(l);
  for (std::string f; in >> f;) v.push_back(f);
  return v;
}

// The data rows of one run: 13 columns each (size count type redop root, then time algbw busbw
// #wrong twice), as nccl-tests prints them.
std::vector<std::vector<std::string>> rows(const std::string& out) {
  std::vector<std::vector<std::string>> r;
  for (const auto& l : lines(out)) {
    auto f = fields(l);
    if (f.size() == 13 && l[0] != '#' && std::isdigit(static_cast<unsigned char>(f[0][0]))) r.push_back(f);
  }
  return r;
}

void expect_format_and_no_wrong(const Proc& r, int np, const char* type, size_t expected_rows) {
  ASSERT_EQ(r.rc, 0) << r.out;
  auto rs = rows(r.out);
  ASSERT_EQ(rs.size(), expected_rows) << r.out;
  for (const auto& f : rs) {
    EXPECT_EQ(f[2], type);
    EXPECT_EQ(f[8], "0") << "out-of-place #wrong in: " << r.out;
    EXPECT_EQ(f[12], "0") << "in-place #wrong in: " << r.out;
  }
  // Header and footer lines exactly as nccl-tests prints them.
  EXPECT_NE(r.out.find("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"), std::string::npos);
  EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos);
  EXPECT_NE(r.out.find("# Avg bus bandwidth    : "), std::string::npos);
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos);
  EXPECT_NE(r.out.find("#  Rank " + std::string(np > 9 ? "" : " ") + std::to_string(np - 1) + " Group"), std::string::npos);
}

TEST(MpiIntegration, AllOpsFloatOnTwoRanksWithCsvAndJson) {
  auto dir = std::filesystem::temp_directory_path() / ("zaya_dist_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Proc r = sh(mpirun(2) + zaya() + " bench collectives --op all -b 8 -e 1M -f 4 -n 2 -w 1 -c 1 --csv " +
              (dir / "r.csv").string() + " --json " + (dir / "r.json").string());
  // 8 B .. 1 MiB by 4: 8, 32, ..., 524288 = 9 sizes; 7 ops.
  expect_format_and_no_wrong(r, 2, "float", 63);
  // Sizes and counts follow nccl-tests: the 8-byte all_gather row over 2 ranks moves 1 float each.
  bool saw = false;
  for (const auto& f : rows(r.out))
    if (f[0] == "8" && f[3] == "none" && f[1] == "1") saw = true;
  EXPECT_TRUE(saw) << r.out;
  std::ifstream csv(dir / "r.csv");
  std::string all((std::istreambuf_iterator<char>(csv)), {});
  EXPECT_EQ(lines(all).size(), 64u);
  EXPECT_EQ(lines(all)[0].rfind("op,ranks,size_bytes,count,type", 0), 0u);
  std::ifstream json(dir / "r.json");
  std::string js((std::istreambuf_iterator<char>(json)), {});
  EXPECT_NE(js.find("\"results\": ["), std::string::npos);
  EXPECT_NE(js.find("\"op\": \"all_to_all\""), std::string::npos);
  EXPECT_NE(js.find("\"op\": \"all_gather_v\""), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(MpiIntegration, AllOpsBfloat16OnFourRanks) {
  Proc r = sh(mpirun(4) + zaya() + " bench collectives --op all -b 8 -e 1M -f 4 -n 2 -w 1 -c 1 --dtype bfloat16");
  expect_format_and_no_wrong(r, 4, "bfloat16", 63);
}

TEST(MpiIntegration, NonPowerOfTwoSizesAndRanks) {
  // 1000, 7000, 49000 B on 3 ranks: counts do not divide, sizes are rounded down as nccl-tests does.
  for (const char* type : {"float", "bfloat16"}) {
    Proc r = sh(mpirun(3) + zaya() + " bench collectives --op all -b 1000 -e 50000 -f 7 -n 2 -w 1 -c 1 --dtype " +
                type);
    expect_format_and_no_wrong(r, 3, type, 21);
    const size_t ts = std::string(type) == "float" ? 4 : 2;
    // The first row of each op, against the pure function (checked by hand in collective_math_test).
    auto rs = rows(r.out);
    for (int op = 0; op < 7; ++op) {
      CollSizes z = coll_sizes(kAllColls[op], 1000, ts, 3);
      EXPECT_EQ(rs[op * 3][0], std::to_string(z.bytes)) << r.out;
      EXPECT_EQ(rs[op * 3][1], std::to_string(z.count)) << r.out;
    }
  }
}

TEST(MpiIntegration, CommunicatorOps) {
  // This test binary's MpiSelf.* tests, run as MPI ranks.
  for (int np : {2, 3}) {
    Proc r = sh(mpirun(np, "-x ZAYA_MPI_SELF_TEST=1") + std::filesystem::read_symlink("/proc/self/exe").string() + " --gtest_filter=MpiSelf.* --gtest_brief=1");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.out.find("SKIPPED"), std::string::npos) << r.out;
  }
}

TEST(MpiIntegration, WrongElementsAreCountedAndFail) {
  Proc r = sh(kEnv + "ZAYA_TEST_CORRUPT_RANK=1 " + mpirun(2, "-x ZAYA_TEST_CORRUPT_RANK") + zaya() +
              " bench collectives --op all_reduce -b 64 -e 64 -n 1 -w 0 -c 1");
  EXPECT_EQ(r.rc, 1) << r.out;  // exit 1: a check failed
  auto rs = rows(r.out);
  ASSERT_EQ(rs.size(), 1u) << r.out;
  EXPECT_EQ(rs[0][8], "1");
  EXPECT_EQ(rs[0][12], "1");
  EXPECT_NE(r.out.find("# Out of bounds values : 2 FAILED"), std::string::npos) << r.out;
}

TEST(MpiIntegration, WorldOfOneNeedsNoMpirun) {
  Proc r = sh(zaya() + " bench collectives --op all -b 8 -e 64 -f 2 -n 1 -w 0");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("backend local, 1 ranks"), std::string::npos) << r.out;
  EXPECT_EQ(rows(r.out).size(), 28u);
}

TEST(MpiIntegration, BadFlagsExit2WithAClearMessage) {
  struct Case {
    const char* args;
    const char* mentions;
  };
  for (const Case& c : {Case{"-b 1M -e 8", "-b"}, Case{"-b -5", "-b"}, Case{"-e 64Q", "-e"},
                        Case{"--op allreduce", "--op"}, Case{"--dtype half", "--dtype"}, Case{"-n 0", "-n"},
                        Case{"-f 0", "-f"}, Case{"--timeout-s 0", "--timeout-s"}}) {
    Proc r = sh(zaya() + " bench collectives " + c.args);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find("zaya: error:"), std::string::npos) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.mentions), std::string::npos) << c.args << ": " << r.out;
  }
}

// Each rank reports its own exit code on stderr, since mpirun reports only one.
std::string per_rank(const std::string& args) {
  return "sh -c '\"$0\" \"$@\"; rc=$?; echo \"zaya-rank-exit $OMPI_COMM_WORLD_RANK $rc\"; exit $rc' " + zaya() +
         " " + args;
}
int rank_exit(const std::string& out, int rank) {
  auto key = "zaya-rank-exit " + std::to_string(rank) + " ";
  auto pos = out.find(key);
  return pos == std::string::npos ? -1 : std::atoi(out.c_str() + pos + key.size());
}

const char* kDieArgs = "bench collectives --op all_reduce -b 8 -e 1M -f 4 -n 2 -w 1 -c 1 --timeout-s 3";

TEST(MpiIntegration, HungRankIsNamedBySurvivorsWithinTheTimeout) {
  Proc r = sh(kEnv + "ZAYA_TEST_DIE_RANK=1 ZAYA_TEST_DIE_AT=30 ZAYA_TEST_DIE_MODE=hang " +
              mpirun(3, "-x ZAYA_TEST_DIE_RANK -x ZAYA_TEST_DIE_AT -x ZAYA_TEST_DIE_MODE") + per_rank(kDieArgs));
  EXPECT_NE(r.rc, 0) << r.out;
  for (int survivor : {0, 2}) {
    EXPECT_NE(r.out.find("on rank " + std::to_string(survivor) + " of 3 timed out after 3 s: rank 1 never arrived"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(rank_exit(r.out, survivor), 2) << r.out;
  }
  // 3 s timeout + 1 s census + start-up; generous because the 2 cores are shared.
  EXPECT_LT(r.seconds, 20) << r.out;
}

TEST(MpiIntegration, DeadRankIsNamedBySurvivorsWhenTheLauncherLetsThemLive) {
  // By default OpenMPI kills the job when a rank exits early (mpirun names the process itself);
  // with abort_on_non_zero_status off the survivors diagnose it, as a supervisor wants.
  Proc r = sh(kEnv + "ZAYA_TEST_DIE_RANK=1 ZAYA_TEST_DIE_AT=30 " +
              mpirun(3, "--mca orte_abort_on_non_zero_status 0 -x ZAYA_TEST_DIE_RANK -x ZAYA_TEST_DIE_AT") +
              per_rank(kDieArgs));
  for (int survivor : {0, 2}) {
    EXPECT_NE(r.out.find("on rank " + std::to_string(survivor) + " of 3 timed out after 3 s: rank 1 never arrived"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(rank_exit(r.out, survivor), 2) << r.out;
  }
  EXPECT_EQ(rank_exit(r.out, 1), 17) << r.out;  // the hook's exit code
  EXPECT_LT(r.seconds, 20) << r.out;
}

TEST(MpiIntegration, DeadRankUnderDefaultMpirunFailsTheJob) {
  Proc r = sh(kEnv + "ZAYA_TEST_DIE_RANK=1 ZAYA_TEST_DIE_AT=30 " +
              mpirun(3, "-x ZAYA_TEST_DIE_RANK -x ZAYA_TEST_DIE_AT") + zaya() + " " + kDieArgs);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 exits at collective call 30"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 20) << r.out;
}

}  // namespace
}  // namespace zaya::dist
