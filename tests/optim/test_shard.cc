// The optimizer over a parameter table and a shard of it (the interface ZeRO-1 uses): two
// optimizers that own the two halves of the flat buffers, each on its own copy of the model with
// the same gradients and exchanging their updated halves after each step (as ZeRO-1's all-gather
// does), leave bitwise the parameters one optimizer over everything leaves — cut at
// a Muon matrix boundary or inside an AdamW parameter — for several steps; with clipping through
// the global norm summed across the shards, to float rounding of the norm; and a range that cuts a
// Muon matrix is refused, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "optim/tiny.h"
#include "zaya/core/error.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/optim_ops.h"
#include "zaya/optim/optimizer.h"

namespace zaya::optim {
namespace {

OptimizerConfig config(double clip) {
  OptimizerConfig c;
  c.muon = true;
  c.grad_clip = clip;
  c.weight_decay = 0.1;
  c.balance_enabled = false;
  return c;
}

// A fresh model from the same init on the same batch: the same gradients every time.
std::unique_ptr<model::ZayaModel> make_model() {
  auto m = std::make_unique<model::ZayaModel>(test::tiny_config(), 2, 16);
  m->init(5);
  return m;
}

void backward(model::ZayaModel& m, int step) {
  test::Batch b = test::make_batch(m.config().vocab_size, 2, 16, 100 + static_cast<uint64_t>(step));
  m.forward(b.tid, b.ttg);
  m.backward();
}

std::vector<float> params(const model::ZayaModel& m) {
  const float* p = m.params_flat().data<float>();
  return std::vector<float>(p, p + m.params_flat().numel());
}

// Steps one optimizer over everything and two over [0, cut) and [cut, P), three steps; returns the
// reference parameters and the two shards' combination.
std::pair<std::vector<float>, std::vector<float>> run_split(int64_t cut, double clip) {
  auto whole = make_model(), lo = make_model(), hi = make_model();
  const int64_t P = whole->params_flat().numel();
  Optimizer o(config(clip), ParamTable::of(*whole));
  Optimizer a(config(clip), ParamTable::of(*lo), ShardRange{0, cut});
  Optimizer b(config(clip), ParamTable::of(*hi), ShardRange{cut, P});
  // The two ranks' squared shard norms, summed as an all-reduce would. The test steps the shards
  // in turn, so each one's part is measured before either steps.
  double sq_lo = 0, sq_hi = 0;
  a.set_sum_across_ranks([&](double) { return sq_lo + sq_hi; });
  b.set_sum_across_ranks([&](double) { return sq_lo + sq_hi; });
  for (int step = 0; step < 3; ++step) {
    backward(*whole, step);
    o.step(1e-2);
    backward(*lo, step);
    backward(*hi, step);
    const Tensor g_lo = lo->grads_flat().window(0, Shape{cut}), g_hi = hi->grads_flat().window(cut, Shape{P - cut});
    const double n_lo = ops::global_grad_norm(std::span<const Tensor>(&g_lo, 1)),
                 n_hi = ops::global_grad_norm(std::span<const Tensor>(&g_hi, 1));
    sq_lo = n_lo * n_lo;
    sq_hi = n_hi * n_hi;
    a.step(1e-2);
    b.step(1e-2);
    // The all-gather of the updated parameters: each copy takes the other shard's half.
    const Tensor lo_p = lo->params_flat(), hi_p = hi->params_flat();
    std::memcpy(hi_p.data<float>(), lo_p.data<float>(), static_cast<size_t>(cut) * sizeof(float));
    std::memcpy(lo_p.data<float>() + cut, hi_p.data<float>() + cut, static_cast<size_t>(P - cut) * sizeof(float));
  }
  std::vector<float> combined = params(*lo);
  const std::vector<float> upper = params(*hi);
  std::copy(upper.begin() + cut, upper.end(), combined.begin() + cut);
  return {params(*whole), combined};
}

TEST(OptimizerShard, TwoHalvesEqualOneWholeBitwise) {
  auto m = make_model();
  // At a Muon matrix boundary (layer 1 starts with its input norm, then its projections) and
  // inside an AdamW parameter (the embedding's middle row).
  const int64_t layer1 = m->layer_range(1).first;
  const int64_t in_embedding = m->param(0).numel() / 2 + 3;
  for (int64_t cut : {layer1, in_embedding}) {
    SCOPED_TRACE(testing::Message() << "cut at element " << cut);
    const auto [ref, split] = run_split(cut, /*clip=*/0);
    ASSERT_EQ(ref.size(), split.size());
    EXPECT_EQ(std::memcmp(ref.data(), split.data(), ref.size() * sizeof(float)), 0);
  }
}

// With clipping the global norm is the two shards' squared norms summed, not one pass over the
// whole buffer, so the clip factor differs in its last bits; through Newton–Schulz that moves the
// parameters by a few float ulps. 1e-5 is far above that and far below an update (lr 1e-2).
TEST(OptimizerShard, ClippingUsesTheGlobalNorm) {
  auto m = make_model();
  const auto [ref, split] = run_split(m->layer_range(1).first, /*clip=*/0.05);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(double(ref[i]) - split[i]));
  EXPECT_LT(worst, 1e-5);
}

TEST(OptimizerShard, RangeThatCutsAMuonMatrixIsRefused) {
  auto m = make_model();
  const int q = m->param_index("model.layers.0.self_attn.qkv_proj.q_proj.weight");
  const int64_t cut = m->param_offset(q) + 5;
  try {
    Optimizer o(config(0), ParamTable::of(*m), ShardRange{0, cut});
    FAIL() << "a range cutting a Muon matrix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.qkv_proj.q_proj.weight"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Optimizer(config(0), ParamTable::of(*m), ShardRange{10, 5}), Error);
}

}  // namespace
}  // namespace zaya::optim
