// The CLI's exit-code contract: 0 success, 2 usage or input errors, and "not built yet" for
// subcommands whose issue has not landed.
#include <gtest/gtest.h>

#include "test_util.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>
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

// The binary names the instruction sets it was built for (and passed its own start-up check to
// print anything at all).
TEST(Cli, VersionAndSysinfoNameTheBuildIsa) {
  CliRun v = zaya("--version");
  EXPECT_EQ(v.code, 0) << v.output;
  EXPECT_NE(v.output.find("zaya, built for -march="), std::string::npos) << v.output;
  CliRun s = zaya("sysinfo");
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("build isa      -march="), std::string::npos) << s.output;
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(zaya("").code, 2);                     // no subcommand
  EXPECT_EQ(zaya("--no-such-flag sysinfo").code, 2);
  EXPECT_EQ(zaya("no-such-command").code, 2);
  CliRun r = zaya("--log-level loud sysinfo");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--log-level"), std::string::npos) << r.output;
}

// `zaya supervise` needs its launch command after --; without one it is a usage error.
TEST(Cli, SuperviseWithoutALaunchCommandExitsTwo) {
  CliRun r = zaya("supervise");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("command"), std::string::npos) << r.output;
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
  EXPECT_NE(r.output.find("full MHA 1280.0 MiB (8.0x more)"), std::string::npos) << r.output;  // serving section
  CliRun bad = zaya(std::string("size --model ") + ZAYA_SOURCE_DIR + "/configs/zaya1-base.toml --hw tpu");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("mi300x, h100, h200"), std::string::npos) << bad.output;
}

TEST(Cli, SizeJointSuggestAndExpertSweep) {
  const std::string base = std::string("size --model ") + ZAYA_SOURCE_DIR + "/configs/zaya1-base.toml --hw h200 ";
  CliRun r = zaya(base + "--suggest --suggest-count 2 --decode-weight 0.5 --objective-batch 64 --sweep-experts");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("0.50 · decode latency at batch 64"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expert sweep   on h200"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("coarse"), std::string::npos) << r.output;
  CliRun bad = zaya(base + "--sweep-json x.json");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("add --sweep-experts"), std::string::npos) << bad.output;
}
}  // namespace

namespace {
// A tiny model's TOML ([model] only) with `layers` layers, written to the test temp dir; its path.
std::string tiny_model_config(const std::string& name, int layers) {
  const std::string path = testing::TempDir() + name;
  std::FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  std::fprintf(f,
               "[model]\nvocab_size = 96\nhidden_size = 32\nnum_hidden_layers = %d\nnum_attention_heads = 2\n"
               "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 2\nmoe_intermediate_size = 32\n"
               "router_hidden_size = 16\n",
               layers);
  std::fclose(f);
  return path;
}

// `zaya bench step --gemm-shapes` on a tiny random model: the per-shape GEMM table is printed,
// with the grouped expert calls as "grouped" rows and the LM head's logits GEMM.
TEST(Cli, BenchStepPrintsGemmShapes) {
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model.toml", 1);
  CliRun r = zaya("--threads 1 bench step --init-config " + cfg + " --seed 1 --steps 1 --batch 2 --seq 16 --gemm-shapes");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("bench: GEMM shapes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("grouped NT ?x64x32 f32"), std::string::npos) << r.output;  // experts' gate_up
  EXPECT_NE(r.output.find("NT 32x96x32 f32"), std::string::npos) << r.output;        // LM-head logits
}

TEST(Cli, BenchStepPartsAddUpToTheStep) {
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model_sections.toml", 2);
  CliRun r = zaya("--threads 1 bench step --init-config " + cfg + " --seed 1 --steps 2 --batch 2 --seq 16 --sections");
  EXPECT_EQ(r.code, 0) << r.output;
  // Every part of both passes is listed once, and the parts account for the whole step: they are
  // consecutive clock intervals inside forward() and backward(), which the step time brackets.
  double step = 0, total = 0, sum = 0, gemm = 0, gemm_sum = 0;
  int parts = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (std::sscanf(line.c_str(), "bench: forward %*f ms, backward %*f ms, step %lf ms", &step) == 1) continue;
    if (std::sscanf(line.c_str(), "bench: parts of the step (per step, GEMMs included; %lf ms in all)", &total) == 1)
      continue;
    if (std::sscanf(line.c_str(), "bench: GEMMs %lf ms per step", &gemm) == 1) continue;
    const size_t ms = line.rfind(" ms ");
    if (line.rfind("bench:   forward: ", 0) == 0 || line.rfind("bench:   backward: ", 0) == 0) {
      ++parts;
      const std::string head = line.substr(0, ms);  // "... <name> <ms>"
      const double t = std::stod(head.substr(head.find_last_of(' ') + 1));
      double share = 0, g = -1, rest = -1;  // "<share>% <GEMMs> <rest>" after the time
      ASSERT_EQ(std::sscanf(line.c_str() + ms + 4, "%lf%% %lf %lf", &share, &g, &rest), 3) << line;
      EXPECT_GE(g, 0) << line;
      EXPECT_NEAR(g + rest, t, 0.011) << line;  // each printed to two decimals
      sum += t;
      gemm_sum += g;
    }
  }
  // 8 forward parts (embedding, 6 per layer, head) + 9 backward (final norm, 6 per layer, layer 0's
  // pending weight gradients, embedding)
  EXPECT_EQ(parts, 17) << r.output;
  EXPECT_GT(step, 0) << r.output;
  // The parts cover the step up to the clock reads between them (microseconds); 10% and 2 ms leave
  // room for a preempted thread on a loaded machine (this tiny step takes a few ms) and the
  // two-decimal printing of sub-millisecond parts.
  EXPECT_NEAR(total, step, 0.1 * step + 2.0) << r.output;
  EXPECT_NEAR(sum, total, 0.1 * step + 2.0) << r.output;
  // Every GEMM of the step runs inside some part, so the parts' GEMM columns add up to the GEMM
  // total (same clock; the margin is the printing's rounding).
  EXPECT_GT(gemm, 0) << r.output;
  EXPECT_NEAR(gemm_sum, gemm, 0.02 * gemm + 0.01 * parts) << r.output;
}

// `bench step --paced` (benchmarks/model_vs_hf.py's paired steps): one timed step per line of
// standard input, each reported as it ends, and a summary over the steps run when the input ends
// before --steps.
TEST(Cli, BenchStepPacedRunsOneStepPerInputLine) {
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model_paced.toml", 1);
  CliRun r = zaya::test::run_shell("printf '\\n\\n' | " + std::string(ZAYA_BINARY) +
                                   " --threads 1 bench step --init-config " + cfg +
                                   " --seed 1 --steps 5 --batch 2 --seq 16 --paced");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LT(r.output.find("bench: ready"), r.output.find("bench: step 1 ")) << r.output;
  std::istringstream in(r.output);
  int steps = 0, summary_steps = 0;
  double fwd_sum = 0, fwd_mean = -1;
  for (std::string line; std::getline(in, line);) {
    int k = 0;
    double f = 0, b = 0, g = 0, gf = 0;
    if (std::sscanf(line.c_str(), "bench: step %d forward %lf ms backward %lf ms gemm %lf ms %lf GFLOP", &k,
                    &f, &b, &g, &gf) == 5) {
      EXPECT_EQ(k, ++steps) << line;
      EXPECT_GT(gf, 0.0) << line;
      fwd_sum += f;
    }
    std::sscanf(line.c_str(), "bench: batch 2 x 16 tokens, %d steps", &summary_steps);
    std::sscanf(line.c_str(), "bench: forward %lf ms", &fwd_mean);
  }
  EXPECT_EQ(steps, 2) << r.output;  // two input lines, not --steps 5
  EXPECT_EQ(summary_steps, 2) << r.output;
  // The summary is the mean of the reported steps (printed to 0.01 ms; the step lines to 0.001).
  EXPECT_NEAR(fwd_mean, fwd_sum / 2, 0.006) << r.output;

  CliRun no_steps = zaya("--threads 1 bench step --init-config " + cfg + " --paced");
  EXPECT_EQ(no_steps.code, 2);
  EXPECT_NE(no_steps.output.find("--steps is required"), std::string::npos) << no_steps.output;
}

// The plain summary a one-step run prints (the lines benchmarks/model_vs_hf.py and tools/step_ab.py
// parse); its times are not checked, only that each line is there.
TEST(Cli, BenchStepPrintsTheTimingLines) {
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model_step.toml", 1);
  CliRun r = zaya("--threads 1 bench step --init-config " + cfg + " --seed 1 --steps 1 --batch 2 --seq 16");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* line : {"bench: batch 2 x 16 tokens, 1 steps, gemm f32, loss ", "bench: forward ", "bench: tokens/s ",
                           "bench: GEMMs ", "bench: activation arena "})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  double fwd = -1, bwd = -1, step = -1;
  const size_t at = r.output.find("bench: forward ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(std::sscanf(r.output.c_str() + at, "bench: forward %lf ms, backward %lf ms, step %lf ms", &fwd, &bwd, &step),
            3)
      << r.output;
}

// --recompute: the same loss (the step is bitwise the same computation; printed to 4 decimals) in
// a smaller activation arena, and the memory line with the peak RSS.
TEST(Cli, BenchStepRecomputeKeepsTheLossAndShrinksTheArena) {
  // 4 layers of 256 tokens: the 3 layers' saved activations recompute drops are ~1 MiB, visible at
  // the 0.1 MiB the line prints.
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model_recompute.toml", 4);
  auto run = [&](const std::string& flag, double& loss, double& arena) {
    CliRun r = zaya("--threads 1 bench step --init-config " + cfg + " --seed 1 --steps 1 --batch 8 --seq 32" + flag);
    EXPECT_EQ(r.code, 0) << r.output;
    const size_t b = r.output.find("bench: batch "), m = r.output.find("bench: memory: ");
    EXPECT_NE(r.output.find(flag.empty() ? "recompute off" : "recompute on"), std::string::npos) << r.output;
    EXPECT_TRUE(b != std::string::npos &&
                std::sscanf(r.output.c_str() + b, "bench: batch 8 x 32 tokens, 1 steps, gemm f32, loss %lf", &loss) == 1)
        << r.output;
    double rss = 0;
    EXPECT_TRUE(m != std::string::npos &&
                std::sscanf(r.output.c_str() + m, "bench: memory: activation arena %lf MiB, peak RSS %lf MiB", &arena,
                            &rss) == 2)
        << r.output;
    EXPECT_GT(rss, 0.0) << r.output;
    return r.output;
  };
  double loss = -1, loss_rc = -2, arena = 0, arena_rc = 0;
  run("", loss, arena);
  const std::string out = run(" --recompute", loss_rc, arena_rc);
  EXPECT_EQ(loss, loss_rc);
  EXPECT_LT(arena_rc, arena);
  EXPECT_NE(out.find("bench: recompute: each layer keeps "), std::string::npos) << out;
}

// forward runs the model only: its former benchmark flags fail (exit 2) with a pointer to
// `zaya bench step` and the flag's new name.
// `generate --batch`: N sequences decoded together, one line of ids each, and --timing's rates;
// prompts of unequal length or a count that is not --batch are refused.
TEST(Cli, GenerateDecodesABatchAndTimesIt) {
  const std::string cfg = tiny_model_config("gen_batch.toml", 2);
  const std::string base = "--threads 1 generate --init-config " + cfg + " --max-new 4 --ignore-eos --timing ";
  CliRun r = zaya(base + "--prompt-ids '3,4,5;6,7,8;9,10,11' --gemm-shapes");
  EXPECT_EQ(r.code, 0) << r.output;
  int lines = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("timing: batch", 0) == 0) {
      EXPECT_NE(line.find("batch 3, prompt 3"), std::string::npos) << line;
      EXPECT_NE(line.find("3 decode steps"), std::string::npos) << line;  // the 4th token needs no step
      continue;
    }
    if (line.rfind("timing: ", 0) == 0) continue;  // the GEMM split and its shapes, checked below

    ++lines;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 3) << line;  // 4 new ids
  }
  EXPECT_EQ(lines, 3) << r.output;
  EXPECT_NE(r.output.find("timing: decode GEMMs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NT 3x"), std::string::npos) << r.output;  // a 3-row decode GEMM's shape
  CliRun shapes_alone = zaya("--threads 1 generate --init-config " + cfg + " --prompt-ids 3 --gemm-shapes");
  EXPECT_EQ(shapes_alone.code, 2) << shapes_alone.output;
  CliRun one = zaya(base + "--prompt-ids 3,4,5 --batch 2");
  EXPECT_EQ(one.code, 0) << one.output;
  CliRun ragged = zaya(base + "--prompt-ids '3,4;5'");
  EXPECT_EQ(ragged.code, 2) << ragged.output;
  EXPECT_NE(ragged.output.find("must have one length"), std::string::npos) << ragged.output;
  CliRun count = zaya(base + "--prompt-ids '3,4;5,6' --batch 3");
  EXPECT_EQ(count.code, 2) << count.output;
  EXPECT_NE(count.output.find("2 prompts were given"), std::string::npos) << count.output;
}

TEST(Cli, ForwardBenchFlagsPointAtBenchStep) {
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model_moved.toml", 1);
  CliRun r = zaya("--threads 1 forward --init-config " + cfg + " --seed 1 --bench-steps 2 --batch 2 --seq 16");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("zaya: error: forward: --bench-steps moved to `zaya bench step` (as --steps)"),
            std::string::npos)
      << r.output;
  CliRun s = zaya("--threads 1 forward --init-config " + cfg + " --ids 1,2,3 --sections");
  EXPECT_EQ(s.code, 2) << s.output;
  EXPECT_NE(s.output.find("--sections moved to `zaya bench step`"), std::string::npos) << s.output;
}
}  // namespace

namespace {
std::string file_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "<cannot open " + path + ">";
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  std::fclose(f);
  return out;
}

// `forward --model` and `generate --model` take a zaya checkpoint (a run directory through its
// `latest`, or the step directory) as well as a transformers directory (issue #4). The same weights
// from either source must give the same logits byte for byte (the import copies every tensor
// exactly) and the same greedy ids; a directory that is neither gets one error naming both kinds.
TEST(Cli, ForwardAndGenerateTakeAZayaCheckpointOrATransformersDirectory) {
  const std::string cfg = tiny_model_config("zaya_cli_tiny_model_sources.toml", 2);
  const std::string tmp = testing::TempDir() + "zaya_cli_sources/";
  ASSERT_EQ(zaya::test::run_shell("rm -rf " + tmp + " && mkdir -p " + tmp + "empty").code, 0);
  CliRun r = zaya("forward --init-config " + cfg + " --seed 7 --save-hf " + tmp + "hf");
  ASSERT_EQ(r.code, 0) << r.output;
  r = zaya("ckpt import-hf " + tmp + "hf --out " + tmp + "run");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string ids = "3,14,15,92,65,35,89,79";
  std::string logits[3];
  const std::string sources[3] = {tmp + "hf", tmp + "run", tmp + "run/step_0000000"};
  for (int i = 0; i < 3; ++i) {
    const std::string out = tmp + "logits" + std::to_string(i) + ".npy";
    r = zaya("--threads 1 forward --model " + sources[i] + " --ids " + ids + " --out " + out);
    ASSERT_EQ(r.code, 0) << sources[i] << "\n" << r.output;
    logits[i] = file_bytes(out);
  }
  EXPECT_GT(logits[0].size(), 8u * 96u * 4u);  // 8 tokens × 96 logits of 4 bytes, plus the header
  EXPECT_EQ(logits[1], logits[0]);
  EXPECT_EQ(logits[2], logits[0]);
  const CliRun g_hf =
      zaya("--threads 1 generate --model " + tmp + "hf --prompt-ids 3,14,15 --max-new 6 --greedy");
  const CliRun g_run =
      zaya("--threads 1 generate --model " + tmp + "run --prompt-ids 3,14,15 --max-new 6 --greedy");
  ASSERT_EQ(g_hf.code, 0) << g_hf.output;
  ASSERT_EQ(g_run.code, 0) << g_run.output;
  EXPECT_EQ(g_run.output, g_hf.output);
  for (const std::string& cmd :
       {"forward --model " + tmp + "empty --ids 1,2", "generate --model " + tmp + "empty --prompt-ids 1,2"}) {
    r = zaya(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("neither a zaya checkpoint"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("nor a transformers model directory"), std::string::npos) << r.output;
  }
  r = zaya("generate --model " + tmp + "hf --prompt-ids 1,2 --temperature -1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--temperature"), std::string::npos) << r.output;
}
}  // namespace
