// One vocabulary across the commands: --model (with --ckpt as another name) for the model in
// eval, forward, generate and bench step; one dtype spelling set (f32/fp32/float32/float,
// bf16/bfloat16) printed as f32/bf16; a mistyped subcommand named with the nearest real one;
// generate's --top-k and --temperature 0 as greedy; defaults that write nothing into the
// current directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <fstream>
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>

#include "test_util.h"

namespace {

using zaya::test::CliRun;
CliRun zaya(const std::string& args) { return zaya::test::run_zaya(args); }
CliRun sh(const std::string& cmd) { return zaya::test::run_shell(cmd); }
bool has(const CliRun& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

// A tiny model as a transformers directory and as a zaya run, plus a dataset its vocabulary covers.
struct Fixture {
  // One directory per test process: ctest runs this file's tests as parallel processes.
  std::string dir = testing::TempDir() + "zaya_cli_vocabulary_" + std::to_string(::getpid()) + "/";
  std::string hf = dir + "hf", run = dir + "run";
  Fixture() {
    EXPECT_EQ(sh("rm -rf " + dir + " && mkdir -p " + dir + "data").code, 0);
    std::FILE* f = std::fopen((dir + "m.toml").c_str(), "w");
    std::fprintf(f,
                 "[model]\nvocab_size = 320\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n"
                 "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 2\nmoe_intermediate_size = 32\n"
                 "router_hidden_size = 16\nmax_position_embeddings = 64\n");
    std::fclose(f);
    f = std::fopen((dir + "corpus.txt").c_str(), "w");
    for (int i = 0; i < 300; ++i) std::fprintf(f, "line %d of the corpus reads code and runs it %d times\n", i, i * 7);
    std::fclose(f);
    EXPECT_EQ(zaya("forward --init-config " + dir + "m.toml --seed 3 --save-hf " + hf).code, 0);
    EXPECT_EQ(zaya("ckpt import-hf " + hf + " --out " + run).code, 0);
    CliRun d = zaya("data prepare --input " + dir + "corpus.txt --vocab 300 --out " + dir + "data/c");
    EXPECT_EQ(d.code, 0) << d.output;
  }
  ~Fixture() { std::filesystem::remove_all(dir); }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

TEST(CliVocabulary, ModelAndCkptAreOneOptionEverywhere) {
  const Fixture& f = fixture();
  for (const std::string& flag : std::initializer_list<std::string>{"--model", "--ckpt"}) {
    SCOPED_TRACE(flag);
    CliRun e = zaya("--threads 1 eval " + flag + " " + f.run + " --data " + f.dir + "data/c_val --seq 16 --samples 2");
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_TRUE(has(e, "perplexity")) << e.output;
    EXPECT_TRUE(has(e, "eval: 2 sequences of 16 tokens from")) << e.output;  // said before it starts
    CliRun fw = zaya("--threads 1 forward " + flag + " " + f.run + " --ids 1,2,3 --loss");
    EXPECT_EQ(fw.code, 0) << fw.output;
    CliRun g = zaya("--threads 1 generate " + flag + " " + f.hf + " --prompt-ids 5,6 --max-new 2");
    EXPECT_EQ(g.code, 0) << g.output;
  }
  CliRun both = zaya("generate --model " + f.hf + " --ckpt " + f.run + " --prompt-ids 5,6");
  EXPECT_EQ(both.code, 2) << both.output;  // one option: given twice is a usage error
}

TEST(CliVocabulary, EveryDtypeSpellingIsAcceptedAndPrintedOneWay) {
  const Fixture& f = fixture();
  for (const std::string& spelling : std::initializer_list<std::string>{"bf16", "bfloat16", "BF16"}) {
    CliRun r = zaya("ckpt export-hf " + f.run + " --out " + f.dir + "x_" + spelling + " --dtype " + spelling);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(has(r, "(bf16)")) << r.output;
  }
  for (const std::string& spelling : std::initializer_list<std::string>{"f32", "fp32", "float32", "float"}) {
    CliRun r = zaya("ckpt export-hf " + f.run + " --out " + f.dir + "x_" + spelling + " --dtype " + spelling);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(has(r, "(f32)")) << r.output;
    CliRun fw = zaya("--threads 1 forward --model " + f.run + " --ids 1,2 --loss --gemm-dtype " + spelling +
                     " --save-hf " + f.dir + "y_" + spelling + " --save-hf-dtype " + spelling);
    EXPECT_EQ(fw.code, 0) << fw.output;
  }
  for (const std::string& cmd : {"ckpt export-hf " + f.run + " --out " + f.dir + "z --dtype half",
                                 "forward --model " + f.run + " --ids 1 --gemm-dtype fp16",
                                 std::string("bench gemm --dtype f16 --shapes 8x8x8")}) {
    CliRun r = zaya(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_TRUE(has(r, "expected f32 (or fp32, float32, float) or bf16 (or bfloat16)")) << r.output;
  }
}

TEST(CliVocabulary, AMistypedCommandGetsTheNearestOne) {
  CliRun r = zaya("--threads 1 trian --config x.toml");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "'trian' is not a zaya command; did you mean 'train'?")) << r.output;
  r = zaya("bench ckp");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "'ckp' is not a zaya bench command; did you mean 'ckpt'?")) << r.output;
  r = zaya("ckpt exprot-hf x --out y");
  EXPECT_TRUE(has(r, "did you mean 'export-hf'?")) << r.output;
  r = zaya("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "'frobnicate' is not a zaya command\nzaya commands: bench ckpt")) << r.output;
  EXPECT_FALSE(has(r, "did you mean")) << r.output;  // nothing close: no guess
  r = zaya("bench --threads 1 ckp");  // a global option's value is not taken for the command
  EXPECT_TRUE(has(r, "'ckp' is not a zaya bench command")) << r.output;
  // Other usage errors keep CLI11's own message.
  r = zaya("sysinfo --bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "--bogus")) << r.output;
}

TEST(CliVocabulary, VersionNamesCommitBuildTypeAndCuda) {
  CliRun r = zaya("--version");
  EXPECT_EQ(r.code, 0) << r.output;
  // The commit is git's (12 hex digits, "-dirty" for local changes), or "unknown" outside a checkout.
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\ncommit      ([0-9a-f]{12}(-dirty)?|unknown)\n")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\nbuild type  [A-Za-z]+\n"))) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\ncuda        (CUDA [0-9.]+|no CUDA)"))) << r.output;
}

// Every checkpoint names the zaya that wrote it: the commit `zaya --version` prints.
TEST(CliVocabulary, CheckpointsNameTheCommitThatWroteThem) {
  const Fixture& f = fixture();
  CliRun v = zaya("--version");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(v.output, m, std::regex("\ncommit      (\\S+)\n"))) << v.output;
  CliRun inspect = zaya("ckpt inspect " + f.run);
  EXPECT_EQ(inspect.code, 0) << inspect.output;
  std::ifstream latest(f.run + "/latest");
  std::string step;
  std::getline(latest, step);
  std::ifstream manifest(f.run + "/" + step + "/manifest.json");
  std::stringstream text;
  text << manifest.rdbuf();
  EXPECT_NE(text.str().find("\"commit\": \"" + m[1].str() + "\""), std::string::npos) << text.str().substr(0, 2000);
}

TEST(CliVocabulary, GlobalOptionsWorkAfterTheSubcommand) {
  CliRun r = zaya("sysinfo --threads 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "(zaya threads: 1)")) << r.output;
  r = zaya("sysinfo --log-level loud");  // parsed as the global option: its own check answers
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "unknown log level")) << r.output;
  const Fixture& f = fixture();
  r = zaya("generate --model " + f.hf + " --prompt-ids 5 --max-new 1 --threads 1 --log-level warn");
  EXPECT_EQ(r.code, 0) << r.output;
  r = zaya("bench membw --help");  // a command's own option of the same name stays its own
  EXPECT_TRUE(has(r, "Comma-separated thread counts")) << r.output;
}

TEST(CliVocabulary, GenerateTopKAndTemperatureZero) {
  const Fixture& f = fixture();
  const std::string base = "--threads 1 generate --model " + f.hf + " --prompt-ids 5,6,7 --max-new 8 ";
  const CliRun greedy = zaya(base + "--greedy");
  ASSERT_EQ(greedy.code, 0) << greedy.output;
  EXPECT_EQ(zaya(base + "--temperature 0").output, greedy.output);
  // Sampling from the single most probable id is argmax, whatever the temperature and seed.
  EXPECT_EQ(zaya(base + "--temperature 1.5 --top-k 1 --seed 9").output, greedy.output);
  // A flat enough distribution over more ids differs from argmax somewhere in 8 draws for some seed.
  bool differs = false;
  for (int seed = 1; seed <= 5 && !differs; ++seed)
    differs = zaya(base + "--temperature 5 --top-k 50 --seed " + std::to_string(seed)).output != greedy.output;
  EXPECT_TRUE(differs);
  CliRun bad = zaya(base + "--temperature 1 --top-k -1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad, "--top-k")) << bad.output;
  CliRun help = zaya("generate --help");
  EXPECT_TRUE(has(help, "0 (the default) is greedy")) << help.output;
  EXPECT_TRUE(has(help, "--top-k")) << help.output;
}

TEST(CliVocabulary, BenchHelpListsCkptAndItsDefaultDirectoryIsTemporary) {
  CliRun help = zaya("bench --help");
  EXPECT_TRUE(has(help, "ckpt")) << help.output;
  const std::string cwd = testing::TempDir() + "zaya_cli_bench_cwd", tmp = testing::TempDir() + "zaya_cli_bench_tmp";
  ASSERT_EQ(sh("rm -rf " + cwd + " " + tmp + " && mkdir -p " + cwd + " " + tmp).code, 0);
  CliRun r = sh("cd " + cwd + " && TMPDIR=" + tmp + " " + ZAYA_BINARY + " --threads 1 bench ckpt --size 1MiB --snapshot copy");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "directory " + tmp)) << r.output;
  EXPECT_EQ(sh("ls -A " + cwd).output, "");  // nothing written where it ran
}

// A GPU run's checkpoint stall: the tensors on the device (here the emulated one, which checks that
// every pass and save takes device tensors; the copy's speed needs a GPU: scripts/gpu_check.sh).
TEST(CliVocabulary, BenchCkptTakesDeviceTensors) {
  const std::string tmp = testing::TempDir() + "zaya_cli_bench_dev";
  ASSERT_EQ(sh("rm -rf " + tmp + " && mkdir -p " + tmp).code, 0);
  CliRun r = sh("ZAYA_EMULATE_CUDA=1 TMPDIR=" + tmp + " " + ZAYA_BINARY + " --threads 1 bench ckpt --size 1MiB --device cuda");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "8 f32 tensors on cuda")) << r.output;
  EXPECT_TRUE(has(r, "deferred: stall / synchronous save")) << r.output;
  CliRun bad = zaya("bench ckpt --size 1MiB --device tpu");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_TRUE(has(bad, "--device: expected cpu or cuda, found 'tpu'")) << bad.output;
}

}  // namespace
