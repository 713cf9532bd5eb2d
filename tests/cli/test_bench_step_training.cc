// `zaya bench step` as the GPU benchmark (benchmarks/gpu_train.py) runs it: --set on the init
// config, the optimizer's update in the step (--optimizer), bf16 weights with fp32 masters
// (--param-dtype), and on a device the model FLOPs line, the device-memory line and the parts of
// the step. The device runs here are on the emulated device (docs/cuda.md), which runs the CPU
// kernels on device tensors: they check what is printed and parsed, not CUDA's speed.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using zaya::test::CliRun;

std::string tiny_config(const std::string& name) {
  const std::string path = testing::TempDir() + name;
  std::FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  std::fprintf(f,
               "[model]\nvocab_size = 96\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n"
               "num_key_value_heads = 1\nhead_dim = 16\nnum_experts = 2\nmoe_intermediate_size = 32\n"
               "router_hidden_size = 16\n[optim]\nlr = 0.01\n");
  std::fclose(f);
  return path;
}

CliRun bench(const std::string& cfg, const std::string& flags, const std::string& env = "") {
  return zaya::test::run_shell(env + " " + ZAYA_BINARY + " --threads 1 bench step --init-config " + cfg +
                               " --seed 1 --batch 2 --seq 16 " + flags);
}

double number_after(const std::string& out, const std::string& prefix) {
  const size_t at = out.find(prefix);
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(at + prefix.size()));
}

// Without the update every step computes the same loss on the same weights; with it the last
// step's loss is that of weights the optimizer has moved (lr 0.01 over 3 updates: the printed
// 4-decimal loss changes). The update's time is part of the step.
TEST(BenchStepTraining, OptimizerUpdatesTheWeightsAndIsTimed) {
  const std::string cfg = tiny_config("zaya_bench_step_optimizer.toml");
  CliRun plain = bench(cfg, "--steps 3");
  CliRun trained = bench(cfg, "--steps 3 --optimizer");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_EQ(trained.code, 0) << trained.output;
  EXPECT_NE(plain.output.find("bench: weights f32, optimizer none"), std::string::npos) << plain.output;
  EXPECT_NE(trained.output.find("bench: weights f32, optimizer Muon + AdamW"), std::string::npos) << trained.output;
  const double loss_plain = number_after(plain.output, "gemm f32, loss "),
               loss_trained = number_after(trained.output, "gemm f32, loss ");
  ASSERT_GT(loss_plain, 0) << plain.output;
  ASSERT_GT(loss_trained, 0) << trained.output;
  EXPECT_NE(loss_plain, loss_trained);
  double fwd = 0, bwd = 0, step = 0;
  const size_t at = trained.output.find("bench: forward ");
  ASSERT_NE(at, std::string::npos) << trained.output;
  ASSERT_EQ(std::sscanf(trained.output.c_str() + at, "bench: forward %lf ms, backward %lf ms, step %lf ms", &fwd, &bwd,
                        &step),
            3);
  const double opt = number_after(trained.output, "bench: optimizer ");
  EXPECT_GE(opt, 0) << trained.output;
  EXPECT_NEAR(fwd + bwd + opt, step, 0.02) << trained.output;  // each printed to two decimals
}

// --set reaches the model and, with --optimizer, the optimizer; a key the command does not read is
// an error naming it, as are a --param-dtype it does not know and sections on a real GPU without
// blocking launches (not testable here: no GPU).
TEST(BenchStepTraining, SetOverridesAndItsErrors) {
  const std::string cfg = tiny_config("zaya_bench_step_set.toml");
  CliRun one = bench(cfg, "--steps 1");
  CliRun two = bench(cfg, "--steps 1 --set model.num_hidden_layers=2");
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  // The model FLOPs per token grow with the layer count.
  EXPECT_GT(number_after(two.output, "bench: model "), number_after(one.output, "bench: model ")) << two.output;
  CliRun adamw = bench(cfg, "--steps 1 --optimizer --set optim.muon=false");
  ASSERT_EQ(adamw.code, 0) << adamw.output;
  EXPECT_NE(adamw.output.find("optimizer AdamW"), std::string::npos) << adamw.output;

  CliRun typo = bench(cfg, "--steps 1 --set model.num_hiden_layers=2");
  EXPECT_EQ(typo.code, 2) << typo.output;
  EXPECT_NE(typo.output.find("'model.num_hiden_layers' is not a key bench step reads"), std::string::npos)
      << typo.output;
  CliRun optim_only = bench(cfg, "--steps 1 --set optim.lr=0.1");  // [optim] is read with --optimizer only
  EXPECT_EQ(optim_only.code, 2) << optim_only.output;
  EXPECT_NE(optim_only.output.find("'optim.lr' is not a key"), std::string::npos) << optim_only.output;
  CliRun dtype = bench(cfg, "--steps 1 --param-dtype f16");
  EXPECT_EQ(dtype.code, 2) << dtype.output;
  EXPECT_NE(dtype.output.find("--param-dtype"), std::string::npos) << dtype.output;
}

// The benchmark's device run: bf16 weights and GEMMs, the optimizer, the parts of the step with
// the update as its own row (no GEMM columns on a device), and the device-memory line, whose peak
// holds at least the weights, gradients, master weights and AdamW's two moments (5 f32 copies of
// the parameters) and no less than what is held after the steps.
TEST(BenchStepTraining, EmulatedDeviceReportsMemoryAndParts) {
  const std::string cfg = tiny_config("zaya_bench_step_device.toml");
  CliRun r = bench(cfg,
                   "--steps 2 --device cuda --optimizer --param-dtype bf16 --gemm-dtype bf16 --sections "
                   "--set optim.muon=false",
                   "ZAYA_EMULATE_CUDA=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("bench: weights bf16 (fp32 master weights), optimizer AdamW"), std::string::npos)
      << r.output;
  double peak = 0, held = 0, arena = 0;
  const size_t at = r.output.find("bench: device memory: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at,
                        "bench: device memory: peak %lf MiB of tensors, %lf MiB held after the steps, activation "
                        "arena %lf MiB",
                        &peak, &held, &arena),
            3)
      << r.output;
  // The tiny model's parameters: 96·32 embedding + per layer ~10k; 5 f32 copies of >= 3072 values.
  EXPECT_GE(peak * 1048576.0, 5 * 4 * 3072.0) << r.output;
  EXPECT_GE(peak, held) << r.output;
  EXPECT_GT(arena, 0) << r.output;
  // The parts table: the model's parts from the embedding's forward to its backward, then the
  // update, each with the GEMM columns as "-".
  std::istringstream in(r.output);
  std::vector<std::string> parts;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("bench:   ", 0) != 0 || line.rfind("bench:   part ", 0) == 0) continue;
    parts.push_back(line.substr(9, line.find("  ", 9) - 9));
    EXPECT_NE(line.find(" -        -"), std::string::npos) << line;
  }
  ASSERT_GE(parts.size(), 18u) << r.output;  // 17 parts of the model (Cli.BenchStepPartsAddUpToTheStep) + the update
  EXPECT_EQ(parts.front(), "forward: embedding") << r.output;
  EXPECT_EQ(parts[parts.size() - 2], "backward: embedding") << r.output;
  EXPECT_EQ(parts.back(), "optimizer: update and balancer") << r.output;
  EXPECT_EQ(r.output.find("bench: GEMMs "), std::string::npos) << r.output;  // the CPU's GEMM clock line
}

TEST(BenchStepTraining, SizeComparesAMeasuredStep) {
  const std::string base = std::string(ZAYA_SOURCE_DIR) + "/configs/zaya1-base.toml";
  CliRun r = zaya::test::run_zaya("size --model " + base +
                                  " --set model.num_hidden_layers=8 --mbs 1 --seq 4096 --hw h200 --measured-step-s 0.5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("measured       step 0.5 s against "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("% measured, "), std::string::npos) << r.output;
  CliRun no_hw = zaya::test::run_zaya("size --model " + base + " --measured-step-s 0.5");
  EXPECT_EQ(no_hw.code, 2) << no_hw.output;
  EXPECT_NE(no_hw.output.find("add --hw"), std::string::npos) << no_hw.output;
}

}  // namespace
