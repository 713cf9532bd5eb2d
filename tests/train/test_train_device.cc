// Training on the device against training on the CPU: the same run's losses, resume on the device
// bit-exact, and a checkpoint moving between the devices (GPU -> CPU and CPU -> GPU). On a GPU
// these run the CUDA kernels; without one they run on the emulated device
// (tests/device_or_emulated.h), which checks that the trainer, the optimizer, the data path and
// the checkpoints keep every tensor where it belongs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "device_or_emulated.h"
#include "train/toy.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

std::vector<float> host_flat(const Tensor& t) { return toy::flat(t.to(Device::cpu)); }

class TrainDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_train_device_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    prefix_ = toy::make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }
  RunConfig config(const std::string& run, int steps, const std::string& device) {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, steps), "toy.toml",
                            {"parallel.device=\"" + device + "\""});
  }
  fs::path root_;
  std::string prefix_;
};

// Each step's loss of two runs of the same config on two devices. fp32 on both: a GPU's sums run
// in other orders, and the difference grows through the updates; 1e-4 relative over these few
// steps of the toy model is two orders above what that growth reaches in them. The emulated device
// takes the GPU's optimizer schedule (each Muon matrix on all threads rather than side by side),
// whose sums differ from the CPU's in their last bits.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, size_t offset = 0) {
  ASSERT_LE(a.size() + offset, b.size() + offset);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i + offset], 1e-4 * std::abs(b[i + offset])) << "step " << i + offset + 1;
}

TEST_F(TrainDevice, TrainsAsTheCpuDoes) {
  ZAYA_GPU_OR_EMULATED(real);
  Trainer cpu(config("cpu", 8, "cpu"), {.quiet = true});
  Trainer dev(config("dev", 8, "cuda"), {.quiet = true});
  const TrainResult a = cpu.run(), b = dev.run();
  ASSERT_EQ(b.losses.size(), 8u);
  expect_close(b.losses, a.losses);
  ASSERT_TRUE(a.final_val_loss && b.final_val_loss);
  EXPECT_NEAR(*b.final_val_loss, *a.final_val_loss, 1e-4 * *a.final_val_loss);
  EXPECT_EQ(dev.model().params_flat().device(), Device::cuda);
}

// bf16 GEMM inputs (the weight GEMMs): 50 steps on the device track the CPU's. The two
// devices round the same f32 values to bf16, but the f32 values already differ in their last bits
// (sums in other orders), so a rounding falls the other way now and then (one bf16 step, 2^-8
// relative, in a few elements); those differences stay in the noise of training: 2% relative per
// step's loss (the steps' own changes are larger) is the bound.
TEST_F(TrainDevice, Bf16TrainingTracksTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  auto bf16 = [&](const std::string& run, const std::string& device) {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, 50), "toy.toml",
                            {"parallel.device=\"" + device + "\"", "train.gemm_dtype=bf16"});
  };
  Trainer cpu(bf16("cpu", "cpu"), {.quiet = true});
  Trainer dev(bf16("dev", "cuda"), {.quiet = true});
  const TrainResult a = cpu.run(), b = dev.run();
  ASSERT_EQ(b.losses.size(), 50u);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 2e-2 * std::abs(a.losses[i])) << "step " << i + 1;
}

// ZAYA1's precision on the device: bf16 weights with fp32 master weights (train.param_dtype =
// "bf16": the bf16 weights, the masters, their update and the rounding live there) and bf16 saved
// activations. The bound is the bf16 one above: a last-bit difference in a master can round its
// bf16 weight the other way, and so can one in a saved activation.
TEST_F(TrainDevice, Bf16WeightsTrackTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  auto bf16 = [&](const std::string& run, const std::string& device) {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, 20), "toy.toml",
                            {"parallel.device=\"" + device + "\"", "train.param_dtype=\"bf16\"",
                             "train.gemm_dtype=\"bf16\"", "train.activation_dtype=\"bf16\""});
  };
  Trainer cpu(bf16("cpu", "cpu"), {.quiet = true});
  Trainer dev(bf16("dev", "cuda"), {.quiet = true});
  const TrainResult a = cpu.run(), b = dev.run();
  ASSERT_EQ(b.losses.size(), 20u);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 2e-2 * std::abs(a.losses[i])) << "step " << i + 1;
  EXPECT_EQ(dev.model().weight_dtype(), DType::bf16);
  EXPECT_EQ(dev.model().activation_dtype(), DType::bf16);
  EXPECT_EQ(dev.model().params_flat().device(), Device::cuda);
}

// The data-parallel machinery on the device at a world of one (what one lent GPU can run): the
// order-independent f64 reduction's gradient sync (fp64 accumulation, narrowing, bucket plan) and
// the parameter gather, prefetched by the forward's hook, on device buffers, with bf16 weights.
// Against the CPU's run of the same config: the fp32 bound of TrainsAsTheCpuDoes, and the bf16
// weights' rounding flips of Bf16WeightsTrackTheCpu (2%).
TEST_F(TrainDevice, GradientSyncOnTheDeviceTracksTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  auto f64 = [&](const std::string& run, const std::string& device) {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, 10), "toy.toml",
                            {"parallel.device=\"" + device + "\"", "parallel.grad_reduce=\"f64\"",
                             "train.param_dtype=\"bf16\"", "train.gemm_dtype=\"bf16\"", "train.grad_accum=2"});
  };
  Trainer cpu(f64("cpu", "cpu"), {.quiet = true});
  Trainer dev(f64("dev", "cuda"), {.quiet = true});
  const TrainResult a = cpu.run(), b = dev.run();
  ASSERT_EQ(b.losses.size(), 10u);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 2e-2 * std::abs(a.losses[i])) << "step " << i + 1;
}

// The issue's own check of mixed precision, on a real GPU only (on the emulated device it would run
// 100 demo-size steps of the CPU kernels, minutes of the suite): 50 steps of configs/demo.toml's
// model and optimizer in bf16 (bf16 GEMM inputs, bf16 weights with fp32 masters, bf16 saved
// activations) on the GPU track the
// same run on the CPU. The corpus is the toy one (the demo's data is not part of the checkout). The
// bound is Bf16TrainingTracksTheCpu's, for its reason: 2% per step's loss.
TEST_F(TrainDevice, DemoModelInBf16TracksTheCpuOverFiftySteps) {
  if (cuda::device_count() == 0 || cuda::emulated())
    GTEST_SKIP() << "needs a GPU (on the emulated device 50 demo-size steps would take minutes)";
  std::string path = std::string(ZAYA_SOURCE_DIR) + "/configs/demo.toml";
  if (!fs::exists(path)) path = "configs/demo.toml";  // a GPU machine runs the packed binaries from its checkout
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto demo = [&](const std::string& run, const std::string& device) {
    return parse_run_config(text, path,
                            {"data.train=[\"" + prefix_ + "\"]", "data.val=\"\"", "data.tokenizer=\"\"",
                             "train.steps=50", "train.eval_every=0", "ckpt.every=0", "ckpt.save_final=false",
                             "train.progress=false", "train.out_dir=\"" + (root_ / run).string() + "\"",
                             "train.gemm_dtype=\"bf16\"", "train.param_dtype=\"bf16\"",
                             "train.activation_dtype=\"bf16\"",
                             "parallel.device=\"" + device + "\""});
  };
  Trainer cpu(demo("cpu", "cpu"), {.quiet = true});
  Trainer dev(demo("dev", "cuda"), {.quiet = true});
  const TrainResult a = cpu.run(), b = dev.run();
  ASSERT_EQ(b.losses.size(), 50u);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 2e-2 * std::abs(a.losses[i])) << "step " << i + 1;
}

TEST_F(TrainDevice, ResumeOnTheDeviceIsBitExact) {
  ZAYA_GPU_OR_EMULATED(real);
  const int total = 10, first = 5;
  Trainer straight(config("straight", total, "cuda"), {.quiet = true});
  const TrainResult a = straight.run();
  {
    Trainer part(config("split", total, "cuda"), {.quiet = true, .stop_after_steps = first});
    part.run();
  }
  Trainer resumed(config("split", total, "cuda"), {.resume = "latest", .quiet = true});
  const TrainResult c = resumed.run();
  ASSERT_EQ(c.losses.size(), static_cast<size_t>(total - first));
  for (int i = 0; i < total - first; ++i) EXPECT_EQ(a.losses[first + i], c.losses[i]) << "step " << first + i + 1;
  EXPECT_EQ(host_flat(straight.model().params_flat()), host_flat(resumed.model().params_flat()));
  EXPECT_EQ(host_flat(straight.model().balancing_biases()), host_flat(resumed.model().balancing_biases()));
}

TEST_F(TrainDevice, CheckpointsMoveBetweenDevices) {
  ZAYA_GPU_OR_EMULATED(real);
  const int total = 8, first = 4;
  Trainer reference(config("reference", total, "cuda"), {.quiet = true});
  const TrainResult a = reference.run();
  for (const auto& [from, to] : {std::pair{"cuda", "cpu"}, std::pair{"cpu", "cuda"}}) {
    const std::string run = std::string(from) + "_to_" + to;
    {
      Trainer part(config(run, total, from), {.quiet = true, .stop_after_steps = first});
      part.run();
    }
    Trainer resumed(config(run, total, to), {.resume = "latest", .quiet = true});
    const TrainResult c = resumed.run();
    ASSERT_EQ(c.first_step, first) << run;
    expect_close(c.losses, a.losses, first);
    EXPECT_EQ(resumed.model().params_flat().device(), std::string(to) == "cuda" ? Device::cuda : Device::cpu);
  }
}

}  // namespace
}  // namespace zaya::train
