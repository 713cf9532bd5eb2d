#include <gtest/gtest.h>

#include "test_util.h"

#include <map>
#include <string>

#include "zaya/core/config.h"
#include "zaya/core/error.h"

namespace zaya {
namespace {

const char* kToml = R"(
[model]
hidden_size = 256
name = "demo"
rope_theta = 10000

[train]
lr = 3e-4
muon = true
steps = [1, 2, 3]

[[recipe.phases]]
tokens = 100
[[recipe.phases]]
tokens = 200
)";

using zaya::test::error_of;

TEST(Config, ReadsTypedValuesAndArraysOfTables) {
  ConfigReader r = ConfigReader::from_string(kToml, "demo.toml");
  int hidden = 0;
  std::string name;
  double theta = 0, lr = 0;
  bool muon = false;
  std::vector<int64_t> steps;
  int missing = 7;
  r.get("model.hidden_size", hidden);
  r.get("model.name", name);
  r.get("model.rope_theta", theta);  // an integer is accepted where a float is expected
  r.get("train.lr", lr);
  r.get("train.muon", muon);
  r.get("train.steps", steps);
  r.get("train.missing", missing);
  ASSERT_EQ(r.table_count("recipe.phases"), 2u);
  int64_t t0 = 0, t1 = 0;
  r.get("recipe.phases[0].tokens", t0);
  r.get("recipe.phases[1].tokens", t1);
  r.finish();
  EXPECT_EQ(hidden, 256);
  EXPECT_EQ(name, "demo");
  EXPECT_EQ(theta, 10000.0);
  EXPECT_EQ(lr, 3e-4);
  EXPECT_TRUE(muon);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(missing, 7);  // absent: default kept
  EXPECT_EQ(t0 + t1, 300);
}

// values(): what each get() produced, a default for an absent key included, in TOML notation
// (floats in their shortest round-trip form), with --set applied.
TEST(Config, ValuesRecordsWhatEachGetProduced) {
  ConfigReader r = ConfigReader::from_string(kToml, "demo.toml", {"train.lr=0.003"});
  int hidden = 0;
  std::string name;
  double lr = 0, missing = 0.1;
  bool muon = false;
  std::vector<int64_t> steps;
  r.get("model.hidden_size", hidden);
  r.get("model.name", name);
  r.get("train.lr", lr);
  r.get("train.muon", muon);
  r.get("train.steps", steps);
  r.get("train.missing", missing);
  const std::map<std::string, std::string> want = {
      {"model.hidden_size", "256"}, {"model.name", "\"demo\""}, {"train.lr", "0.003"},
      {"train.muon", "true"},       {"train.steps", "[1, 2, 3]"}, {"train.missing", "0.1"}};
  EXPECT_EQ(r.values(), want);
}

TEST(Config, UnknownKeyNamesKeyFileAndSuggestion) {
  ConfigReader r = ConfigReader::from_string("[model]\nhiden_size = 3\n", "configs/x.toml");
  int hidden = 0;
  r.get("model.hidden_size", hidden);
  std::string msg = error_of([&] { r.finish(); });
  EXPECT_NE(msg.find("configs/x.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'model.hiden_size'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'model.hidden_size'"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesExpectedAndFound) {
  ConfigReader r = ConfigReader::from_string("[model]\nhidden_size = \"big\"\n", "c.toml");
  int hidden = 0;
  std::string msg = error_of([&] { r.get("model.hidden_size", hidden); });
  EXPECT_NE(msg.find("c.toml: model.hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found string \"big\""), std::string::npos) << msg;
}

TEST(Config, RequiredKeyMissing) {
  ConfigReader r = ConfigReader::from_string("", "c.toml");
  std::string prefix;
  std::string msg = error_of([&] { r.require("data.prefix", prefix); });
  EXPECT_NE(msg.find("data.prefix"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(Config, OverridesReplaceAddAndAreValidated) {
  ConfigReader r = ConfigReader::from_string(kToml, "demo.toml",
                                             {"model.hidden_size=512", "train.lr=1e-3", "model.name=big model",
                                              "new.section.flag=true"});
  int hidden = 0;
  double lr = 0;
  std::string name;
  bool flag = false;
  r.get("model.hidden_size", hidden);
  r.get("train.lr", lr);
  r.get("model.name", name);  // not TOML syntax: taken as a string
  r.get("new.section.flag", flag);
  EXPECT_EQ(hidden, 512);
  EXPECT_EQ(lr, 1e-3);
  EXPECT_EQ(name, "big model");
  EXPECT_TRUE(flag);

  ConfigReader bad = ConfigReader::from_string(kToml, "demo.toml", {"model.hiddn_size=1"});
  int h = 0;
  bad.get("model.hidden_size", h);
  std::string msg = error_of([&] { bad.finish(); });
  EXPECT_NE(msg.find("--set"), std::string::npos) << msg;

  EXPECT_NE(error_of([] { ConfigReader::from_string("", "c.toml", {"novalue"}); }).find("section.key=value"),
            std::string::npos);
  ConfigReader typed = ConfigReader::from_string("", "c.toml", {"model.hidden_size=\"x\""});
  int hh = 0;
  EXPECT_NE(error_of([&] { typed.get("model.hidden_size", hh); }).find("--set model.hidden_size"),
            std::string::npos);
}

TEST(Config, InvalidTomlNamesLine) {
  std::string msg = error_of([] { ConfigReader::from_string("[model]\nhidden = = 3\n", "bad.toml"); });
  EXPECT_NE(msg.find("bad.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  std::string missing = error_of([] { ConfigReader::from_file("/nonexistent/zaya.toml"); });
  EXPECT_NE(missing.find("cannot open"), std::string::npos) << missing;
}

}  // namespace
}  // namespace zaya

namespace zaya {
namespace {

// An ifstream opens a directory and reads nothing: `--init-config DIR` used to run with an all-
// default model, and `train --config DIR` to complain about data.train.
TEST(Config, DirectoryIsNamedAsOne) {
  const std::string dir = testing::TempDir();
  const std::string e = zaya::test::error_of([&] { ConfigReader::from_file(dir); });
  EXPECT_NE(e.find(": is a directory; expected a TOML config file"), std::string::npos) << e;
  const std::string missing = zaya::test::error_of([&] { ConfigReader::from_file(dir + "/no_such.toml"); });
  EXPECT_NE(missing.find("cannot open config file"), std::string::npos) << missing;
  EXPECT_NE(missing.find("No such file or directory"), std::string::npos) << missing;
}

}  // namespace
}  // namespace zaya
