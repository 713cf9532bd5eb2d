// Mixed precision (train.param_dtype = "bf16", train/master_weights.h): the model computes with
// bf16 weights while the optimizer updates fp32 master weights, which the checkpoints store. The
// swap around the update on its own; then whole runs: the weights between steps are bf16 values,
// the checkpoint's are the fp32 masters that round to them, the run tracks the f32 one, and a
// resume continues bitwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ops/gradcheck.h"
#include "train/toy.h"
#include "zaya/ckpt/reader.h"
#include "zaya/train/master_weights.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

float bf16_value(float x) { return to_float(to_bf16(x)); }
bool is_bf16_value(float x) { return bf16_value(x) == x; }

TEST(MasterWeights, SwapsTheOwnedRangeAroundTheUpdate) {
  Tensor params = test::random_tensor({10}, 3);
  const std::vector<float> start = toy::flat(params);
  MasterWeights m(params, {3, 7});
  EXPECT_EQ(m.bytes(), 4 * 4);
  m.adopt();
  std::vector<float> p = toy::flat(params), master = toy::flat(m.master());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(p[i], bf16_value(start[i])) << "element " << i << " rounded";
  for (int i = 0; i < 4; ++i) EXPECT_EQ(master[i], start[3 + i]) << "the owned range kept whole";

  m.before_update();
  p = toy::flat(params);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p[3 + i], start[3 + i]) << "the optimizer sees the masters";
  // An update smaller than bf16's spacing: lost in bf16 weights, kept by the masters.
  float* q = params.data<float>();
  for (int i = 3; i < 7; ++i) q[i] += 1e-5f * std::abs(q[i]);
  const std::vector<float> updated = toy::flat(params);
  m.after_update();
  p = toy::flat(params);
  master = toy::flat(m.master());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(master[i], updated[3 + i]);
    EXPECT_EQ(p[3 + i], bf16_value(updated[3 + i]));
  }
  for (int i : {0, 1, 2, 7, 8, 9}) EXPECT_EQ(p[i], bf16_value(start[i])) << "outside the range: untouched";
}

TEST(MasterWeights, ARangeOutsideTheBufferIsRefused) {
  Tensor params = Tensor::zeros({10}, DType::f32);
  EXPECT_THROW(MasterWeights(params, {4, 12}), Error);
  EXPECT_THROW(MasterWeights(Tensor::zeros({2, 5}, DType::f32), {}), Error);
}

class MixedPrecision : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_mixed_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    prefix_ = toy::make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }
  RunConfig config(const std::string& run, int steps, const std::string& param_dtype) {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, steps), "toy.toml",
                            {"train.param_dtype=\"" + param_dtype + "\""});
  }
  fs::path root_;
  std::string prefix_;
};

// bf16 weights carry 8 bits of mantissa (2^-9 relative rounding) against f32's 24, so the two runs
// differ from the first step on: by about 1e-4 relative in the loss over these 12 steps of the toy
// model, in which the loss falls by 10%. 1e-3 per step bounds that, while updates lost to the
// rounding (no master weights) or a wrong master would show by the end of the run.
TEST_F(MixedPrecision, WeightsAreBf16AndCheckpointsHoldTheMasters) {
  const int steps = 12;
  Trainer f32(config("f32", steps, "f32"), {.quiet = true});
  Trainer b16(config("bf16", steps, "bf16"), {.quiet = true});
  const TrainResult a = f32.run(), b = b16.run();
  ASSERT_EQ(b.losses.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) EXPECT_NEAR(b.losses[s], a.losses[s], 1e-3 * a.losses[s]) << "step " << s + 1;
  EXPECT_LT(b.losses.back(), b.losses.front() * 0.95) << "the bf16-weight run did not learn";

  const std::vector<float> weights = toy::flat(b16.model().params_flat());
  size_t not_bf16 = 0;
  for (float w : weights) not_bf16 += !is_bf16_value(w);
  EXPECT_EQ(not_bf16, 0u) << "weights between steps must be bf16 values";

  // The final checkpoint holds the masters: they round to the model's weights, and most are not
  // bf16 values themselves.
  ckpt::Checkpoint c(root_ / "bf16");
  size_t off = 0, masters_not_bf16 = 0, total = 0;
  for (size_t i = 0; i < b16.model().specs().size(); ++i) {
    const model::ParamSpec& spec = b16.model().specs()[i];
    const std::vector<float> saved = toy::flat(c.load_full(spec.name));
    off = static_cast<size_t>(b16.model().param_offset(static_cast<int>(i)));
    for (size_t j = 0; j < saved.size(); ++j) {
      ASSERT_EQ(bf16_value(saved[j]), weights[off + j]) << spec.name << "[" << j << "]";
      masters_not_bf16 += !is_bf16_value(saved[j]);
      ++total;
    }
  }
  EXPECT_GT(masters_not_bf16, total / 2) << "the checkpoint holds rounded weights, not fp32 masters";
}

TEST_F(MixedPrecision, ResumeIsBitExact) {
  const int total = 10, first = 5;
  Trainer straight(config("straight", total, "bf16"), {.quiet = true});
  const TrainResult a = straight.run();
  {
    Trainer part(config("split", total, "bf16"), {.quiet = true, .stop_after_steps = first});
    part.run();
  }
  Trainer resumed(config("split", total, "bf16"), {.resume = "latest", .quiet = true});
  const TrainResult c = resumed.run();
  ASSERT_EQ(c.losses.size(), static_cast<size_t>(total - first));
  for (int i = 0; i < total - first; ++i) EXPECT_EQ(a.losses[first + i], c.losses[i]) << "step " << first + i + 1;
  EXPECT_EQ(toy::flat(straight.model().params_flat()), toy::flat(resumed.model().params_flat()));
  ckpt::Checkpoint x(root_ / "straight"), y(root_ / "split");
  for (const model::ParamSpec& spec : straight.model().specs())
    EXPECT_EQ(toy::flat(x.load_full(spec.name)), toy::flat(y.load_full(spec.name))) << spec.name;
}

}  // namespace
}  // namespace zaya::train
