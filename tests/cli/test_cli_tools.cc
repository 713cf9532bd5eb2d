// What a user sees of a run from the outside: the fixed, named MFU peak (printed at start, in every
// metrics.jsonl record, set by --mfu-peak), checkpoints that carry their tokenizer (generate and
// export-hf from another directory after the data directory is gone), and progress on stderr while
// eval and tokenizer training run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {
namespace fs = std::filesystem;
using zaya::test::CliRun;

CliRun zaya(const std::string& args) { return zaya::test::run_zaya("--threads 1 " + args); }
bool has(const CliRun& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

// A corpus prepared with its own tokenizer, and a tiny model's run config over it.
class CliTools : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("zaya_cli_tools_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    std::string corpus;
    for (int i = 0; i < 300; ++i)
      corpus += "line " + std::to_string(i) + " of the corpus reads code and runs it " + std::to_string(i * 7) + " times\n";
    write(dir_ / "corpus.txt", corpus);
    const CliRun d = zaya("data prepare --input " + (dir_ / "corpus.txt").string() + " --vocab 300 --out " +
                          (dir_ / "data" / "c").string());
    ASSERT_EQ(d.code, 0) << d.output;
    write(dir_ / "run.toml",
          "[model]\nvocab_size = 320\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n"
          "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 2\nmoe_intermediate_size = 32\n"
          "router_hidden_size = 16\nmax_position_embeddings = 64\n"
          "[data]\ntrain = [\"" + (dir_ / "data" / "c_train").string() + "\"]\nval = \"" +
          (dir_ / "data" / "c_val").string() + "\"\ntokenizer = \"" + (dir_ / "data" / "c.model").string() +
          "\"\n[train]\nsteps = 2\nmicro_batch = 2\nseq_len = 16\neval_every = 0\neval_samples = 2\n"
          "progress = false\nout_dir = \"" + (dir_ / "run").string() + "\"\n[optim]\nwarmup_steps = 1\n");
  }
  void TearDown() override { fs::remove_all(dir_); }
  CliRun train(const std::string& extra = "") {
    return zaya("train --config " + (dir_ / "run.toml").string() + " " + extra);
  }
  std::vector<nlohmann::json> step_records() {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir_ / "run" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (nlohmann::json j = nlohmann::json::parse(line); j.contains("loss")) out.push_back(j);
    return out;
  }
  fs::path dir_;
};

TEST_F(CliTools, MfuPeakIsNamedPrintedAndOverridable) {
  CliRun r = train();
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "MFU peak: cpu, ")) << r.output;
  EXPECT_TRUE(has(r, " f32 FLOP/cycle (")) << r.output;  // the formula, written out
  for (const auto& rec : step_records()) EXPECT_EQ(rec["mfu_peak"], "cpu");

  fs::remove_all(dir_ / "run");
  r = train("--mfu-peak 1e11");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "MFU peak: stated, 0.1 TFLOP/s per rank x 1 rank = 0.1 TFLOP/s")) << r.output;
  for (const auto& rec : step_records()) EXPECT_DOUBLE_EQ(rec["mfu_peak_tflops"].get<double>(), 0.1);

  // A hardware profile (zaya bench gemm --out): its name and peak.
  write(dir_ / "box.json",
        R"({"name": "box", "peak_bf16_flops": 2e11, "memory_bytes": 1e9, "memory_bandwidth": 1e10})");
  fs::remove_all(dir_ / "run");
  r = train("--mfu-peak " + (dir_ / "box.json").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "MFU peak: box, 0.2 TFLOP/s")) << r.output;

  fs::remove_all(dir_ / "run");
  r = train("--mfu-peak h100");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "MFU peak: h100, 989 TFLOP/s")) << r.output;
  EXPECT_TRUE(has(r, "NVIDIA H100 SXM datasheet")) << r.output;

  r = train("--mfu-peak h800");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "train.mfu_peak")) << r.output;
  r = train("--mfu-peak -5");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "--mfu-peak")) << r.output;
}

TEST_F(CliTools, CheckpointsCarryTheirTokenizer) {
  const CliRun r = train();
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string original = slurp(dir_ / "data" / "c.model");
  ASSERT_FALSE(original.empty());
  // The data directory goes away; the commands run from a directory that holds nothing of the run.
  fs::rename(dir_ / "data", dir_ / "moved");
  fs::create_directories(dir_ / "elsewhere");
  const std::string cd = "cd " + (dir_ / "elsewhere").string() + " && ";
  const std::string run = (dir_ / "run").string();
  const CliRun gen = zaya::test::run_shell(cd + ZAYA_BINARY + " --threads 1 generate --model " + run +
                                           " --prompt 'line 5 of' --max-new 3");
  EXPECT_EQ(gen.code, 0) << gen.output;
  EXPECT_TRUE(has(gen, "line 5 of")) << gen.output;  // the prompt, decoded back
  const CliRun exp = zaya::test::run_shell(cd + ZAYA_BINARY + " --threads 1 ckpt export-hf " + run + " --out " +
                                           (dir_ / "hf").string());
  EXPECT_EQ(exp.code, 0) << exp.output;
  EXPECT_EQ(slurp(dir_ / "hf" / "tokenizer.model"), original);  // the very file it trained with

  // An imported transformers folder's tokenizer stays with the import when the folder goes.
  const std::string imported = (dir_ / "imported").string();
  const CliRun imp = zaya("ckpt import-hf " + (dir_ / "hf").string() + " --out " + imported);
  ASSERT_EQ(imp.code, 0) << imp.output;
  fs::remove_all(dir_ / "hf");
  const CliRun gen2 = zaya::test::run_shell(cd + ZAYA_BINARY + " --threads 1 generate --model " + imported +
                                            " --prompt 'line 5 of' --max-new 3");
  EXPECT_EQ(gen2.code, 0) << gen2.output;
  EXPECT_EQ(gen2.output, gen.output);  // the same weights and tokenizer: the same greedy text
}

// `zaya --version` names the release version, and every checkpoint's state records it beside the
// commit (state.written_by, in manifest.json).
TEST_F(CliTools, VersionIsPrintedAndWrittenIntoEveryCheckpoint) {
  const CliRun v = zaya("--version");
  ASSERT_EQ(v.code, 0) << v.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(v.output, m, std::regex("\nversion     ([0-9]+\\.[0-9]+\\.[0-9]+)\n"))) << v.output;
  const std::string version = m[1].str();
  ASSERT_EQ(train().code, 0);
  const std::string imported = (dir_ / "imported").string();
  ASSERT_EQ(zaya("forward --init-config " + (dir_ / "run.toml").string() + " --save-hf " + (dir_ / "hf").string()).code, 0);
  ASSERT_EQ(zaya("ckpt import-hf " + (dir_ / "hf").string() + " --out " + imported).code, 0);
  for (const fs::path& run : {dir_ / "run", fs::path(imported)}) {
    std::ifstream latest(run / "latest");
    std::string step;
    std::getline(latest, step);
    const nlohmann::json manifest = nlohmann::json::parse(slurp(run / step / "manifest.json"));
    EXPECT_EQ(manifest["state"]["written_by"]["version"], version) << run;
    EXPECT_TRUE(manifest["state"]["written_by"].contains("commit")) << run;
  }
}

// Output captured through a pipe is not a terminal: progress comes as log lines, one per tenth.
TEST_F(CliTools, EvalAndTokenizerTrainingShowProgress) {
  // Its own prepare, to read the lines it writes.
  fs::create_directories(dir_ / "again");
  const std::string prepare = "data prepare --input " + (dir_ / "corpus.txt").string() + " --vocab 300 --out " +
                              (dir_ / "again" / "c").string();
  CliRun r = zaya(prepare);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "data prepare: tokenizer: ")) << r.output;
  EXPECT_TRUE(has(r, "/300 pieces (")) << r.output;
  EXPECT_TRUE(has(r, "data prepare: tokenizer: 300/300 pieces (100%)")) << r.output;
  EXPECT_FALSE(has(r, "LOG(INFO)")) << r.output;  // SentencePiece's own lines stay out,
  EXPECT_FALSE(has(r, "trainer_spec")) << r.output;  // also the lines of a multi-line message
  // The same tokenizer with progress on and off: the progress only reads SentencePiece's log.
  fs::create_directories(dir_ / "quiet");
  r = zaya("--log-level info " + prepare.substr(0, prepare.find("--out")) + "--out " + (dir_ / "quiet" / "c").string() +
           " --no-progress");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(has(r, "pieces (")) << r.output;
  EXPECT_EQ(slurp(dir_ / "quiet" / "c.model"), slurp(dir_ / "again" / "c.model"));

  ASSERT_EQ(train().code, 0);
  const std::string eval = "eval --model " + (dir_ / "run").string() + " --data " + (dir_ / "data" / "c_val").string() +
                           " --batch 1 --seq 8 --samples 20";
  r = zaya(eval);
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t half = r.output.find("eval: 10/"), done = r.output.find("batches (100%)"),
               result = r.output.find("perplexity");
  ASSERT_NE(half, std::string::npos) << r.output;
  ASSERT_NE(done, std::string::npos) << r.output;
  EXPECT_LT(half, done);
  EXPECT_LT(done, result);  // while it runs, before the result
  // On a terminal (script(1) gives it one): one line redrawn in place, not a line per batch.
  if (zaya::test::run_shell("command -v script").code == 0) {
    const CliRun tty = zaya::test::run_shell("script -qec \"" + std::string(ZAYA_BINARY) + " --threads 1 " + eval +
                                             "\" /dev/null");
    ASSERT_EQ(tty.code, 0) << tty.output;
    size_t redraws = 0;
    for (size_t at = tty.output.find("\reval: "); at != std::string::npos; at = tty.output.find("\reval: ", at + 1))
      ++redraws;
    EXPECT_GE(redraws, 1u) << tty.output;
    EXPECT_LT(redraws, 20u) << tty.output;  // 20 batches of 8 tokens take far less than the 4 s 20 redraws need
    EXPECT_TRUE(has(tty, "batches (100%)")) << tty.output;
    EXPECT_FALSE(has(tty, " I eval: 10/")) << tty.output;  // no log lines on a terminal
  }
  r = zaya(eval + " --no-progress");
  EXPECT_FALSE(has(r, "batches (")) << r.output;
  r = zaya("--log-level warn " + eval);
  EXPECT_FALSE(has(r, "batches (")) << r.output;
}

}  // namespace
