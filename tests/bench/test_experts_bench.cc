// `zaya bench gemm --experts-tokens`: the experts op timed as decode runs it, into the profile's
// experts_table.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>

#include "device_or_emulated.h"
#include "zaya/bench/experts_bench.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/sizing/hardware.h"

namespace zaya::bench {
namespace {

TEST(ExpertsBench, RoundRobinSpreadsTokensEvenlyFromTheFirstExpert) {
  EXPECT_EQ(round_robin_rows(1, 8, 0), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(round_robin_rows(3, 8, 6), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 1, 1}));  // wraps at E
  EXPECT_EQ(round_robin_rows(8, 8, 3), (std::vector<int64_t>(8, 1)));
  EXPECT_EQ(round_robin_rows(20, 8, 0), (std::vector<int64_t>{3, 3, 3, 3, 2, 2, 2, 2}));
  for (int64_t t : {1, 7, 33})
    for (int64_t first : {0, 5}) {
      const auto rows = round_robin_rows(t, 8, first);
      EXPECT_EQ(std::accumulate(rows.begin(), rows.end(), int64_t{0}), t);
    }
}

TEST(ExpertsBench, LayersHoldAtLeastTheBytesAskedForAndAtLeastTwo) {
  ExpertsBenchOptions o;
  o.experts = 8, o.hidden = 1024, o.intermediate = 1024, o.tokens = {1};
  o.dtype = DType::f32;  // one layer: 8 · 3 · 1024 · 1024 · 4 B = 96 MiB
  o.min_bytes = 512.0 * (1 << 20);
  EXPECT_EQ(experts_bench_layers(o), 6);  // ceil(512 / 96)
  o.dtype = DType::bf16;
  EXPECT_EQ(experts_bench_layers(o), 11);  // ceil(512 / 48)
  o.min_bytes = 1;
  EXPECT_EQ(experts_bench_layers(o), 2);
}

TEST(ExpertsBench, BadOptionsNameTheFlag) {
  ExpertsBenchOptions o;
  o.experts = 4, o.hidden = 32, o.intermediate = 16, o.tokens = {1, 0};
  auto message = [&] {
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message().find("--experts-tokens"), std::string::npos) << message();
  o.tokens = {};
  EXPECT_NE(message().find("--experts-tokens"), std::string::npos) << message();
  o.tokens = {2};
  o.min_bytes = 0;
  EXPECT_NE(message().find("--experts-bytes"), std::string::npos) << message();
  o.min_bytes = 1;
  EXPECT_EQ(message(), "(accepted)");
}

// Times tiny experts on `device`, checks what comes back, and that it merges into a profile.
void time_tiny_experts(Device device, DType dtype) {
  ExpertsBenchOptions o;
  o.experts = 4, o.hidden = 32, o.intermediate = 16, o.tokens = {1, 3, 8};
  o.dtype = dtype, o.device = device, o.warmup = 1, o.repeats = 3, o.min_bytes = 1;
  std::ostringstream out;
  const auto rows = run_experts_bench(o, out);
  ASSERT_EQ(rows.size(), 3u);
  const int64_t hit[] = {1, 3, 4};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i].tokens, o.tokens[i]);
    EXPECT_EQ(rows[i].experts_hit, hit[i]);
    EXPECT_EQ(rows[i].experts, 4);
    EXPECT_EQ(rows[i].hidden, 32);
    EXPECT_EQ(rows[i].intermediate, 16);
    EXPECT_EQ(rows[i].weight_dtype, dtype == DType::bf16 ? "bf16" : "f32");
    EXPECT_GT(rows[i].seconds, 0.0);
  }
  EXPECT_NE(out.str().find("us/hit expert"), std::string::npos) << out.str();
  // Into a profile: a re-measurement replaces its entry, other entries stay.
  sizing::HardwareProfile p;
  p.experts_table = {{3, 4, 3, 32, 16, rows[1].weight_dtype, 99.0}, {3, 4, 3, 64, 16, "f32", 7.0}};
  merge_experts_table(p, rows);
  ASSERT_EQ(p.experts_table.size(), 4u);
  EXPECT_EQ(p.experts_table[0].seconds, rows[1].seconds);
  EXPECT_EQ(p.experts_table[1].seconds, 7.0);
}

TEST(ExpertsBench, TimesTheExpertsOpOnTheCpu) {
  time_tiny_experts(Device::cpu, DType::f32);
  time_tiny_experts(Device::cpu, DType::bf16);
}

// On a GPU the CUDA experts op; without one the emulated device checks that every tensor the op
// touches is placed on the device (the CUDA kernels themselves need a GPU: scripts/gpu_check.sh).
TEST(ExpertsBench, TimesTheExpertsOpOnTheDevice) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "CPU-only build";
  ZAYA_GPU_OR_EMULATED(real);
  const test::EmulationOffAtExit off{!real};  // other tests of this binary expect no device
  time_tiny_experts(Device::cuda, DType::f32);
  time_tiny_experts(Device::cuda, DType::bf16);
}

// The command line: `bench gemm --experts-tokens` writes the table, `zaya size` prices decode by it.
std::string run(const std::string& cmd, int* status) {
  std::array<char, 4096> buf{};
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((cmd + " 2>&1").c_str(), "r"), pclose);
  while (fgets(buf.data(), buf.size(), pipe.get())) out += buf.data();
  *status = pclose(pipe.release());
  return out;
}

TEST(ExpertsBench, CommandLineWritesTheTableAndSizePricesDecodeWithIt) {
  const std::string dir = ::testing::TempDir() + "/zaya_experts_cli";
  std::filesystem::create_directories(dir);
  const std::string cfg = dir + "/tiny.toml", prof = dir + "/profile.json";
  std::filesystem::remove(prof);
  std::ofstream(cfg)
      << "[model]\nvocab_size = 512\nhidden_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 2\n"
         "num_key_value_heads = 1\nhead_dim = 32\nnum_experts = 4\nmoe_intermediate_size = 64\n"
         "router_hidden_size = 32\nmax_position_embeddings = 256\n";
  const std::string zaya = std::string(ZAYA_BINARY) + " --threads 1";
  int status = 0;
  std::string out =
      run(zaya + " bench gemm --shapes model:" + cfg +
              " --tokens 2 --dtype f32 --ref-dim 0 -w 0 -n 1 --experts-tokens 1,2 --experts-bytes 1M --out " +
              prof,
          &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("2 experts-op entries"), std::string::npos) << out;
  const sizing::HardwareProfile p = sizing::load_profile(prof);
  ASSERT_EQ(p.experts_table.size(), 2u);
  EXPECT_EQ(p.experts_table[1].tokens, 2);
  EXPECT_EQ(p.experts_table[1].experts_hit, 2);
  // The profile has no memory_bandwidth of its own: give it one, as --membw would.
  sizing::HardwareProfile q = p;
  q.memory_bandwidth = 10e9;
  sizing::save_profile(q, prof);
  out = run(zaya + " size --model " + cfg + " --hw " + prof +
                " --seq 32 --decode-batches 1,2 --weight-bytes 4 --cache-bytes 4",
            &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("experts: measured: ops::experts_forward of 4 experts of H 64, I 64 at 4-byte weights"),
            std::string::npos)
      << out;
  out = run(zaya + " size --model " + cfg + " --hw " + prof + " --seq 32 --decode-batches 1 --weight-bytes 2",
            &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("experts: roofline (the profile's experts_table has no entry"), std::string::npos)
      << out;
  // --experts-tokens needs a model's shapes.
  out = run(zaya + " bench gemm --sweep --min-dim 8 --max-dim 8 --experts-tokens 1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--experts-tokens"), std::string::npos) << out;
}

}  // namespace
}  // namespace zaya::bench
