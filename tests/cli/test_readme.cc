// README "Using it" runs as written from a directory outside the checkout: each command of its
// code blocks, in order, from a fresh temporary directory, with only the changes that make it
// tiny (a small corpus and vocabulary, a few short steps, small benchmark sizes; the table below),
// and nothing may be written into the checkout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace {
namespace fs = std::filesystem;
using zaya::test::CliRun;

const std::string kSource = ZAYA_SOURCE_DIR;

// The command lines of the ```bash blocks of the README's "## Using it" section, comments removed.
std::vector<std::string> using_it_commands() {
  std::ifstream in(kSource + "/README.md");
  std::vector<std::string> out;
  bool section = false, block = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) section = line == "## Using it";
    if (!section) continue;
    if (line.rfind("```", 0) == 0) {
      block = !block;
      continue;
    }
    if (!block) continue;
    if (const size_t c = line.find("  #"); c != std::string::npos) line.resize(c);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << "the README line no longer has '" << from << "': " << s;
  s.replace(at, from.size(), to);
}

// The tiny form of one README command: the same command, smaller.
std::string tiny(std::string cmd, const std::string& corpus) {
  const std::string tiny_train =
      " --set train.steps=2 --set train.micro_batch=1 --set train.seq_len=32 --set train.eval_every=0"
      " --set train.eval_samples=1 --set model.num_hidden_layers=1 --set model.vocab_size=320";
  if (contains(cmd, " data prepare ")) {
    replace(cmd, "--input /usr/share/doc/python3.11/html/_sources", "--input " + corpus);
    replace(cmd, "--vocab 8192", "--vocab 300");
  } else if (contains(cmd, " train --config ")) {
    cmd += tiny_train;  // a later --set wins (the line's own train.steps=200 too)
  } else if (contains(cmd, " eval ")) {
    cmd += " --samples 2 --batch 1";
  } else if (contains(cmd, " generate ")) {
    cmd += " --max-new 4";
  } else if (contains(cmd, " bench collectives ")) {
    replace(cmd, "-e 64M", "-e 1K");
  } else if (contains(cmd, " bench step ")) {
    replace(cmd, "--steps 5", "--steps 1");
    cmd += " --batch 1 --seq 32";
  } else if (contains(cmd, " bench membw")) {
    cmd += " --min-bytes 1M --max-bytes 1M -n 1 --threads 1";
  } else if (contains(cmd, " bench gemm ")) {
    cmd += " --tokens 64 --ref-dim 0 -w 0 -n 1";
  } else if (contains(cmd, " bench ckpt ")) {
    replace(cmd, "--size 2GiB", "--size 4MiB");
  }
  return cmd;
}

// What the README's commands make, relative to where they run.
const char* const kMade[] = {"data/pydocs.model",  "data/pydocs_train.idx",  "runs/demo/latest",
                             "runs/demo/metrics.jsonl", "runs/dp2/latest", "runs/supervised/latest",
                             "demo-hf/config.json", "demo-hf/tokenizer.model", "runs/imported/latest",
                             "logits.npy",         "profile.json"};

// Those paths in the checkout, with their modification times (a checkout where the demo ran has
// some): a command that wrote into the checkout changes this. Only these paths, so that other
// tests running at the same time cannot disturb it.
std::vector<std::pair<std::string, fs::file_time_type>> checkout_state() {
  std::vector<std::pair<std::string, fs::file_time_type>> out;
  for (const char* made : kMade) {
    std::error_code ec;
    const fs::file_time_type t = fs::last_write_time(fs::path(kSource) / made, ec);
    if (!ec) out.emplace_back(made, t);
  }
  return out;
}

TEST(Readme, UsingItRunsAsWrittenFromAnyDirectory) {
  const std::vector<std::string> commands = using_it_commands();
  ASSERT_GE(commands.size(), 10u);
  ASSERT_EQ(commands[0].rfind("source /path/to/zaya/scripts/env.sh", 0), 0u) << commands[0];

  const fs::path cwd = fs::path(testing::TempDir()) / ("zaya_readme_" + std::to_string(::getpid()));
  fs::remove_all(cwd);
  fs::create_directories(cwd);
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "The Python interpreter reads line " + std::to_string(i) + " and runs it " + std::to_string(i * 3) + " times.\n";
  std::ofstream(cwd / "corpus.txt") << corpus;

  // The README's `source` line with this checkout for /path/to/zaya, and the build this test
  // belongs to (scripts/zaya runs $ZAYA_ROOT/build/$ZAYA_PRESET/zaya).
  const std::string preset = fs::path(ZAYA_BINARY).parent_path().filename().string();
  ASSERT_EQ(fs::path(ZAYA_BINARY).parent_path(), fs::path(kSource) / "build" / preset)
      << "scripts/zaya runs the checkout's build/<preset>/zaya, not this test's binary";
  std::string prologue = commands[0];
  replace(prologue, "/path/to/zaya", kSource);
  prologue = "export ZAYA_PRESET=" + preset + " OMP_WAIT_POLICY=PASSIVE ZAYA_THREADS=1 && " + prologue + " && cd " +
             cwd.string() + " && ";

  const auto before = checkout_state();
  const bool tensorboard =
      zaya::test::run_shell(kSource + "/.venv/bin/python -c 'import tensorboard'").code == 0;
  for (size_t i = 1; i < commands.size(); ++i) {
    if (contains(commands[i], "metrics_to_tensorboard.py") && !tensorboard) {
      std::printf("skipped (no .venv with tensorboard): %s\n", commands[i].c_str());
      continue;
    }
    const std::string cmd = tiny(commands[i], (cwd / "corpus.txt").string());
    std::string script = prologue + cmd, quoted;  // one shell word for bash -c
    for (char c : script) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    const CliRun r = zaya::test::run_shell("bash -c '" + quoted + "'");
    std::printf("exit %d: %s\n", r.code, cmd.c_str());
    EXPECT_EQ(r.code, 0) << "README line: " << commands[i] << "\nran as: " << cmd << "\n" << r.output;
  }
  // What the lines say they write, in the working directory.
  for (const char* made : kMade) EXPECT_TRUE(fs::exists(cwd / made)) << made;
  // MFU's peak is the sum of the ranks' (each runs ZAYA_THREADS=1 thread, so the CPU formula counts one
  // core per rank): two ranks divide by twice one rank's peak.
  auto first_peak = [&](const char* run) {
    std::ifstream in(cwd / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (const auto j = nlohmann::json::parse(line); j.contains("mfu_peak_tflops")) return j["mfu_peak_tflops"].get<double>();
    return 0.0;
  };
  EXPECT_GT(first_peak("runs/demo"), 0);
  EXPECT_DOUBLE_EQ(first_peak("runs/dp2"), 2 * first_peak("runs/demo"));
  if (tensorboard) {
    EXPECT_TRUE(fs::exists(cwd / "runs/demo/tensorboard")) << "runs/demo/tensorboard";
  }
  EXPECT_TRUE(checkout_state() == before) << "a README command wrote into the checkout";
  fs::remove_all(cwd);
}

}  // namespace
