// Mixed precision (train.param_dtype = "bf16", train/master_weights.h): the model stores and
// computes with bf16 weights while the optimizer updates fp32 master weights, which the checkpoints
// store. The masters on their own; then whole runs: the weights are bf16, the checkpoint's values
// are the fp32 masters that round to them, the run tracks the run with f32 weights, and a resume
// continues bitwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/random_model.h"
#include "train/toy.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ops/dense.h"
#include "zaya/optim/optimizer.h"
#include "zaya/train/master_weights.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

float bf16_value(float x) { return to_float(to_bf16(x)); }
bool is_bf16_value(float x) { return bf16_value(x) == x; }

// The model's weights as floats, whatever their storage.
std::vector<float> weights_of(const model::ZayaModel& m) {
  const Tensor& w = m.params_flat();
  if (w.dtype() == DType::f32) return toy::flat(w.to(Device::cpu));
  Tensor wide = Tensor::empty(w.shape(), DType::f32, w.device());
  ops::cast_to_f32(wide, w);
  return toy::flat(wide.to(Device::cpu));
}

model::ModelConfig tiny() {
  return test::small_config({.nq = 2, .nkv = 1, .hd = 8, .E = 2, .L = 1, .R = 8, .I = 8, .H = 16, .V = 32}, 16);
}

TEST(MasterWeights, AdoptKeepsTheOwnedRangeInFp32AndStoresTheWeightsInBf16) {
  model::ZayaModel m(tiny(), 1, 4);
  test::randomize(m, 3);
  m.set_gemm_dtype(DType::bf16);
  const std::vector<float> start = toy::flat(m.params_flat());
  const int64_t P = static_cast<int64_t>(start.size()), lo = 40, hi = 300;
  MasterWeights mw(m, {lo, hi});
  EXPECT_EQ(mw.bytes(), 4 * (hi - lo));
  mw.adopt();
  ASSERT_EQ(m.weight_dtype(), DType::bf16);
  std::vector<float> w = weights_of(m), master = toy::flat(mw.master());
  for (int64_t i = 0; i < P; ++i) ASSERT_EQ(w[i], bf16_value(start[i])) << "element " << i << " rounded";
  for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(master[i - lo], start[i]) << "the owned range kept whole";

  // An update smaller than bf16's spacing: lost in the bf16 weights, kept by the masters.
  float* q = mw.master().data<float>();
  for (int64_t i = 0; i < hi - lo; ++i) q[i] += 1e-5f * std::abs(q[i]);
  const std::vector<float> updated = toy::flat(mw.master());
  mw.after_update();
  w = weights_of(m);
  for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(w[i], bf16_value(updated[i - lo])) << "element " << i;
  for (int64_t i : {int64_t{0}, lo - 1, hi, P - 1}) EXPECT_EQ(w[i], bf16_value(start[i])) << "outside: untouched";
  EXPECT_EQ(toy::flat(mw.master()), updated) << "after_update leaves the masters as they are";
}

// The optimizer's table holds the masters from the range's first element: it updates them, never
// the bf16 weights (which after_update then rounds from them).
TEST(MasterWeights, TheOptimizerUpdatesTheMasters) {
  model::ZayaModel m(tiny(), 1, 4);
  test::randomize(m, 4);
  m.set_gemm_dtype(DType::bf16);
  const int64_t P = m.params_flat().numel();
  MasterWeights mw(m, {0, P});
  const optim::ParamTable table = mw.table();
  EXPECT_EQ(table.params.raw(), mw.master().raw());
  EXPECT_EQ(table.params_begin, 0);
  optim::OptimizerConfig oc;
  oc.lr = 1e-2;
  optim::Optimizer opt(oc, table);
  mw.adopt();
  const std::vector<float> before = weights_of(m), masters = toy::flat(mw.master());
  Tensor(m.grads_flat()).fill_(0.5);
  opt.step(oc.lr);
  EXPECT_EQ(weights_of(m), before) << "the step wrote the bf16 weights";
  const std::vector<float> moved = toy::flat(mw.master());
  size_t changed = 0;
  for (int64_t i = 0; i < P; ++i) changed += moved[i] != masters[i];
  EXPECT_GT(changed, static_cast<size_t>(P / 2)) << "the step did not update the masters";
  mw.after_update();
  const std::vector<float> w = weights_of(m);
  for (int64_t i = 0; i < P; ++i) ASSERT_EQ(w[i], bf16_value(moved[i])) << "element " << i;
}

TEST(MasterWeights, RefusesARangeOutsideTheModelAndBf16Weights) {
  model::ZayaModel m(tiny(), 1, 4);
  m.init(1);
  const int64_t P = m.params_flat().numel();
  EXPECT_THROW(MasterWeights(m, {4, P + 1}), Error);
  m.set_gemm_dtype(DType::bf16);
  MasterWeights mw(m, {0, P});
  mw.adopt();
  EXPECT_THROW(mw.adopt(), Error) << "adopted twice: the f32 values are gone";
  EXPECT_THROW(MasterWeights(m, {0, P}), Error) << "masters from bf16 weights";
  EXPECT_THROW(optim::Optimizer(optim::OptimizerConfig{}, optim::ParamTable::of(m)), Error)
      << "an optimizer updates f32 values (the masters), not the bf16 weights";
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
  // bf16 GEMMs in every precision (bf16 weights need them): the runs differ in the weights (and
  // the saved activations) alone.
  RunConfig config(const std::string& run, int steps, const std::string& param_dtype,
                   const std::string& activation_dtype = "f32") {
    return parse_run_config(toy::toy_config(prefix_, root_ / run, steps), "toy.toml",
                            {"train.param_dtype=\"" + param_dtype + "\"", "train.gemm_dtype=\"bf16\"",
                             "train.activation_dtype=\"" + activation_dtype + "\""});
  }
  fs::path root_;
  std::string prefix_;
};

// bf16 weights carry 8 significant bits (2^-8 relative rounding) against f32's 24, so the two runs
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

  ASSERT_EQ(b16.model().weight_dtype(), DType::bf16) << "the weights are stored in bf16";
  EXPECT_EQ(f32.model().weight_dtype(), DType::f32);
  const std::vector<float> weights = weights_of(b16.model());

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

// ZAYA1's precision whole: bf16 GEMMs, bf16 weights with fp32 masters and bf16 saved activations
// (the backward reads rounded activations too). Against the run with only bf16 GEMMs the loss moves
// by the weights' rounding, as above, plus the gradients' (each step's gradient within a few 2^-8
// of the other's: tests/model/test_model_bf16_activations.cc), which the update scales by the
// learning rate: 2e-3 per step's loss bounds both over these 12 steps, while a backward that read
// wrong activations would not learn.
TEST_F(MixedPrecision, Zaya1PrecisionLearnsAndTracksTheF32WeightsRun) {
  const int steps = 12;
  Trainer f32(config("f32", steps, "f32"), {.quiet = true});
  Trainer z1(config("zaya1", steps, "bf16", "bf16"), {.quiet = true});
  const TrainResult a = f32.run(), b = z1.run();
  ASSERT_EQ(b.losses.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) EXPECT_NEAR(b.losses[s], a.losses[s], 2e-3 * a.losses[s]) << "step " << s + 1;
  EXPECT_LT(b.losses.back(), b.losses.front() * 0.95) << "the run did not learn";
  EXPECT_EQ(z1.model().activation_dtype(), DType::bf16);
}

TEST_F(MixedPrecision, ResumeIsBitExact) {
  const int total = 10, first = 5;
  Trainer straight(config("straight", total, "bf16", "bf16"), {.quiet = true});
  const TrainResult a = straight.run();
  {
    Trainer part(config("split", total, "bf16", "bf16"), {.quiet = true, .stop_after_steps = first});
    part.run();
  }
  Trainer resumed(config("split", total, "bf16", "bf16"), {.resume = "latest", .quiet = true});
  const TrainResult c = resumed.run();
  ASSERT_EQ(c.losses.size(), static_cast<size_t>(total - first));
  for (int i = 0; i < total - first; ++i) EXPECT_EQ(a.losses[first + i], c.losses[i]) << "step " << first + i + 1;
  EXPECT_EQ(weights_of(straight.model()), weights_of(resumed.model()));
  ckpt::Checkpoint x(root_ / "straight"), y(root_ / "split");
  for (const model::ParamSpec& spec : straight.model().specs())
    EXPECT_EQ(toy::flat(x.load_full(spec.name)), toy::flat(y.load_full(spec.name))) << spec.name;
}

}  // namespace
}  // namespace zaya::train
