// Resource bounds of the CLI, checked before anything is allocated: thread counts, generation
// length and sequence lengths against max_position_embeddings, and arguments that used to be
// accepted with a meaningless result (--eos -3, a loss over one id).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "test_util.h"

namespace {

using zaya::test::CliRun;
CliRun zaya(const std::string& args) { return zaya::test::run_zaya(args); }

bool has(const CliRun& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// A transformers directory of a tiny random model whose max_position_embeddings is 64 (made once
// per test process by `zaya forward --save-hf`, in a directory of its own: ctest runs each test in
// a process of its own, possibly in parallel).
const std::string& tiny_hf_model() {
  static const std::string dir = [] {
    const std::string tmp = testing::TempDir() + "zaya_cli_limits_" + std::to_string(getpid()) + "/";
    EXPECT_EQ(zaya::test::run_shell("rm -rf " + tmp + " && mkdir -p " + tmp).code, 0);
    std::FILE* f = std::fopen((tmp + "tiny.toml").c_str(), "w");
    EXPECT_NE(f, nullptr);
    if (f) {
      std::fputs(
          "[model]\nvocab_size = 96\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n"
          "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 2\nmoe_intermediate_size = 32\n"
          "router_hidden_size = 16\nmax_position_embeddings = 64\n",
          f);
      std::fclose(f);
    }
    CliRun r = zaya("--threads 1 forward --init-config " + tmp + "tiny.toml --seed 3 --save-hf " + tmp + "hf");
    EXPECT_EQ(r.code, 0) << r.output;
    return tmp + "hf";
  }();
  return dir;
}

std::string ids_1_to(int n) {
  std::string s;
  for (int i = 1; i <= n; ++i) {
    if (i > 1) s += ',';
    s += std::to_string(i % 90);
  }
  return s;
}

// --threads 0 and negative counts were taken as "all threads", 20000 exhausted memory and 100000
// crashed inside libgomp: each is now an error naming the flag, before any runtime sees it.
TEST(CliLimits, ThreadCountsOutsideOneToFourTimesTheHardwareAreErrors) {
  for (const char* n : {"0", "-5", "100000", "99999999999"}) {
    CliRun r = zaya(std::string("--threads ") + n + " sysinfo");
    EXPECT_EQ(r.code, 2) << n << "\n" << r.output;
    EXPECT_TRUE(has(r, "zaya: error: --threads: expected a thread count in [1, ")) << r.output;
  }
  CliRun env = zaya::test::run_shell("ZAYA_THREADS=20000 " + std::string(ZAYA_BINARY) + " sysinfo");
  EXPECT_EQ(env.code, 2) << env.output;
  EXPECT_TRUE(has(env, "ZAYA_THREADS: expected a thread count in [1, ")) << env.output;
  CliRun ok = zaya("--threads 1 sysinfo");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(has(ok, "(zaya threads: 1)")) << ok.output;
}

// generate --max-new 1000000000 allocated decode caches for a billion positions (24 GB on the probe
// machine): prompt + --max-new must now fit max_position_embeddings, checked before the caches.
TEST(CliLimits, GenerateBoundsPromptPlusMaxNewByMaxPositionEmbeddings) {
  const std::string hf = tiny_hf_model();
  CliRun r = zaya("--threads 1 generate --model " + hf + " --prompt-ids 1,2 --max-new 1000000000");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "--max-new 1000000000: the prompt's 2 tokens + 1000000000 new ones exceed the model's "
                     "max_position_embeddings (64); use --max-new 62 or less"))
      << r.output;
  r = zaya("--threads 1 generate --model " + hf + " --prompt-ids " + ids_1_to(65) + " --max-new 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "the prompt's 65 tokens exceed the model's max_position_embeddings (64)")) << r.output;
  // The longest allowed generation runs and fills every position.
  r = zaya("--threads 1 generate --model " + hf + " --prompt-ids 1,2 --max-new 62 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.output;
  int commas = 0;
  for (char c : r.output) commas += c == ',';
  EXPECT_EQ(commas, 61) << r.output;  // 62 ids
}

// --eos -3 (and any id outside the vocabulary) was accepted and could never match.
TEST(CliLimits, GenerateRejectsAnEosOutsideTheVocabulary) {
  const std::string hf = tiny_hf_model();
  for (const char* eos : {"-3", "-1", "96"}) {
    CliRun r = zaya("--threads 1 generate --model " + hf + " --prompt-ids 1,2 --max-new 2 --eos " + eos);
    EXPECT_EQ(r.code, 2) << eos << "\n" << r.output;
    EXPECT_TRUE(has(r, std::string("--eos: expected a token id in [0, 96) (or --ignore-eos to never stop early), "
                                   "found ") + eos))
        << r.output;
  }
  CliRun ok = zaya("--threads 1 generate --model " + hf + " --prompt-ids 1,2 --max-new 2 --eos 95");
  EXPECT_EQ(ok.code, 0) << ok.output;
}

// forward --ids 5 --loss printed "loss 0": one id has no next-token target.
TEST(CliLimits, ForwardLossNeedsAtLeastTwoIds) {
  const std::string hf = tiny_hf_model();
  for (const std::string& flags :
       {std::string("--loss"), "--grads-out " + tiny_hf_model() + "/../g.safetensors"}) {
    CliRun r = zaya("--threads 1 forward --model " + hf + " --ids 5 " + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.output;
    EXPECT_TRUE(has(r, "forward: --loss and --grads-out need at least 2 ids (each position predicts the next id), "
                       "found 1"))
        << r.output;
  }
  CliRun ok = zaya("--threads 1 forward --model " + hf + " --ids 5,6 --loss");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(has(ok, "loss ")) << ok.output;
  EXPECT_FALSE(has(ok, "loss 0\n")) << ok.output;
}

// forward ran 65 positions through a model made for 64 without a word; so did --init-config.
TEST(CliLimits, ForwardBoundsTheSequenceByMaxPositionEmbeddings) {
  const std::string hf = tiny_hf_model();
  const std::string cfg = hf.substr(0, hf.size() - 2) + "tiny.toml";
  for (const std::string& src : {"--model " + hf, "--init-config " + cfg}) {
    CliRun r = zaya("--threads 1 forward " + src + " --ids " + ids_1_to(65) + " --loss");
    EXPECT_EQ(r.code, 2) << src << "\n" << r.output;
    EXPECT_TRUE(has(r, "forward: 65 positions exceed the model's max_position_embeddings (64)")) << r.output;
    r = zaya("--threads 1 forward " + src + " --ids " + ids_1_to(64) + " --loss");
    EXPECT_EQ(r.code, 0) << src << "\n" << r.output;
  }
}

}  // namespace

namespace {

// A path that cannot be used was reported as "internal error: filesystem error ..." (exit 3): it is
// now a usage error naming the path and the reason.
TEST(CliLimits, UnusableOutputPathIsNamedWithTheReason) {
  const std::string tmp = testing::TempDir() + "zaya_cli_limits_fs_" + std::to_string(getpid());
  ASSERT_EQ(zaya::test::run_shell("rm -rf " + tmp + " && touch " + tmp).code, 0);  // a file, not a directory
  CliRun r = zaya("--threads 1 forward --model " + tiny_hf_model() + " --save-hf " + tmp + "/hf");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "zaya: error: " + tmp + "/hf: cannot create directories: Not a directory")) << r.output;
  std::remove(tmp.c_str());
}

// `--config DIR` read as an empty config (train complained about data.train; forward --init-config
// ran an all-default model).
TEST(CliLimits, ConfigThatIsADirectoryIsNamedAsOne) {
  const std::string dir = testing::TempDir();
  for (const std::string& cmd : {"train --config " + dir, "forward --ids 1,2 --init-config " + dir}) {
    CliRun r = zaya(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_TRUE(has(r, ": is a directory; expected a TOML config file")) << r.output;
  }
}

}  // namespace
