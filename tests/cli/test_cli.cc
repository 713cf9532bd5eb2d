// The CLI's exit-code contract: 0 success, 2 usage or input errors, and "not built yet" for
// subcommands whose issue has not landed.
#include <gtest/gtest.h>

#include "test_util.h"

#include <array>
#include <cstdio>
#include <string>

namespace {

using zaya::test::CliRun;
CliRun zaya(const std::string& args) { return zaya::test::run_zaya(args); }

TEST(Cli, SysinfoSucceeds) {
  CliRun r = zaya("sysinfo");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("oneDNN"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDA devices"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("avx512_bf16"), std::string::npos) << r.output;
}

TEST(Cli, HelpSucceeds) { EXPECT_EQ(zaya("--help").code, 0); }

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(zaya("").code, 2);                     // no subcommand
  EXPECT_EQ(zaya("--no-such-flag sysinfo").code, 2);
  EXPECT_EQ(zaya("no-such-command").code, 2);
  CliRun r = zaya("--log-level loud sysinfo");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--log-level"), std::string::npos) << r.output;
}

TEST(Cli, PendingCommandsSaySoAndExitTwo) {
  for (const char* cmd : {"supervise"}) {
    CliRun r = zaya(cmd);
    EXPECT_EQ(r.code, 2) << cmd;
    EXPECT_NE(r.output.find("not built yet"), std::string::npos) << r.output;
  }
}

}  // namespace

namespace {
TEST(Cli, SizeZaya1Base) {
  CliRun r = zaya(std::string("size --model ") + ZAYA_SOURCE_DIR + "/configs/zaya1-base.toml");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("non-embedding 8.303B"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("active 0.754B"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("embedding 0.537B"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("40960 bytes per token"), std::string::npos) << r.output;
  CliRun bad = zaya(std::string("size --model ") + ZAYA_SOURCE_DIR + "/configs/zaya1-base.toml --hw tpu");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("mi300x, h100, h200"), std::string::npos) << bad.output;
}
}  // namespace
