// The ZeRO-1 shard plan: ranges that cover the flat buffer exactly once, cut only where a
// checkpoint chunk and Newton–Schulz allow (whole AdamW rows, whole Muon matrices), every Muon
// matrix owned by exactly one rank, optimizer state within one piece of 1/N per rank, and a plan
// the optimizer accepts; on ZAYA1-base's shapes at cluster sizes, the imbalances it reports.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "optim/tiny.h"
#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/grouping.h"
#include "zaya/optim/optimizer.h"
#include "zaya/optim/shard_plan.h"
#include "zaya/core/config.h"

namespace zaya::optim {
namespace {

OptimizerConfig muon_config() {
  OptimizerConfig c;
  c.muon = true;
  c.balance_enabled = false;
  return c;
}

std::vector<int64_t> offsets_of(const std::vector<model::ParamSpec>& specs) {
  std::vector<int64_t> off;
  int64_t at = 0;
  for (const model::ParamSpec& s : specs) {
    off.push_back(at);
    at += s.shape.numel();
  }
  return off;
}

// Every invariant the trainer relies on, checked independently of the planner's own validate().
void check_plan(const ShardPlan& plan, const std::vector<model::ParamSpec>& specs, const OptimizerConfig& cfg, int world) {
  const std::vector<int64_t> off = offsets_of(specs);
  int64_t P = 0;
  for (const auto& s : specs) P += s.shape.numel();
  ASSERT_EQ(static_cast<int>(plan.ranks.size()), world);
  ASSERT_EQ(plan.numel, P);
  // Exactly once: each range starts where the previous ends, the last ends at P.
  int64_t at = 0, state = 0, biggest_piece = 0;
  for (const RankShare& s : plan.ranks) {
    EXPECT_EQ(s.begin, at);
    EXPECT_GE(s.end, s.begin);
    at = s.end;
    state += s.state_bytes;
  }
  EXPECT_EQ(at, P);
  // Every Muon matrix has one owner, which holds all of it; AdamW parameters are cut between rows.
  int64_t muon_matrices = 0, owned = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamGroup g = group_of(specs[i], cfg);
    const int64_t n = specs[i].shape.numel();
    const int64_t unit = g.group == Group::muon ? g.rows * g.cols : (specs[i].shape.ndim() ? n / specs[i].shape[0] : n);
    biggest_piece = std::max(biggest_piece, unit * (g.group == Group::muon ? 4 : 8));
    for (const RankShare& s : plan.ranks) {
      if (s.begin > off[i] && s.begin < off[i] + n) {
        EXPECT_EQ((s.begin - off[i]) % unit, 0) << specs[i].name;
      }
    }
    if (g.group != Group::muon) continue;
    for (int64_t m = 0; m < g.count; ++m) {
      const int64_t b = off[i] + m * unit, e = b + unit;
      ++muon_matrices;
      const int owner = plan.owner_of(b);
      EXPECT_EQ(plan.owner_of(e - 1), owner) << specs[i].name << " matrix " << m;
    }
  }
  for (const RankShare& s : plan.ranks) owned += s.muon_matrices;
  EXPECT_EQ(owned, muon_matrices);
  // State per rank within one indivisible piece of the ideal 1/N share.
  for (const RankShare& s : plan.ranks)
    EXPECT_LE(std::abs(static_cast<double>(s.state_bytes) - static_cast<double>(state) / world),
              static_cast<double>(biggest_piece))
        << "rank state " << s.state_bytes;
}

TEST(ShardPlan, TinyModelAtSeveralWorldSizes) {
  const model::ModelConfig mc = test::tiny_config();
  const std::vector<model::ParamSpec> specs = model::parameter_specs(mc);
  for (int world : {1, 2, 3, 4, 7, 16}) {
    SCOPED_TRACE(world);
    const ShardPlan plan = plan_shards(specs, offsets_of(specs), muon_config(), world);
    check_plan(plan, specs, muon_config(), world);
  }
  // AdamW only: the cuts may fall anywhere between rows.
  OptimizerConfig adamw = muon_config();
  adamw.muon = false;
  check_plan(plan_shards(specs, offsets_of(specs), adamw, 3), specs, adamw, 3);
}

TEST(ShardPlan, EveryRankRangeIsAcceptedByTheOptimizer) {
  auto m = std::make_unique<model::ZayaModel>(test::tiny_config(), 1, 8);
  const ParamTable table = ParamTable::of(*m);
  const ShardPlan plan = plan_shards(table, muon_config(), 3);
  size_t state = 0;
  for (int r = 0; r < 3; ++r) {
    Optimizer o(muon_config(), table, plan.range(r));
    state += o.state_bytes();
    // The sharded checkpoint parts are hyper-rectangles: whole rows of each parameter.
    for (const Optimizer::StatePart& p : o.state_parts()) {
      ASSERT_EQ(p.offsets.size(), p.global_shape.size()) << p.name;
      for (size_t d = 1; d < p.offsets.size(); ++d) EXPECT_EQ(p.offsets[d], 0) << p.name;
    }
  }
  EXPECT_GT(state, 0u);
}

TEST(ShardPlan, OwnerOfAndBadInput) {
  const std::vector<model::ParamSpec> specs = model::parameter_specs(test::tiny_config());
  const ShardPlan plan = plan_shards(specs, offsets_of(specs), muon_config(), 2);
  EXPECT_EQ(plan.owner_of(0), 0);
  EXPECT_EQ(plan.owner_of(plan.numel - 1), 1);
  EXPECT_EQ(plan.owner_of(plan.ranks[1].begin), 1);
  EXPECT_THROW(plan.owner_of(plan.numel), Error);
  EXPECT_THROW(plan_shards(specs, offsets_of(specs), muon_config(), 0), Error);
  ShardPlan broken = plan;
  broken.ranks[0].end -= 1;  // a gap
  EXPECT_THROW(broken.validate(specs, offsets_of(specs), muon_config()), Error);
}

// ZAYA1-base's parameter shapes (no model is allocated): the plan at cluster sizes, and the
// imbalances the start-up summary prints. The Newton–Schulz imbalance is bounded by the AdamW
// share at the front of the buffer and by one matrix per rank (docs/data-parallel.md).
TEST(ShardPlan, Zaya1BaseAtClusterSizes) {
  ConfigReader r = ConfigReader::from_file(std::string(ZAYA_SOURCE_DIR) + "/configs/zaya1-base.toml");
  const model::ModelConfig mc = model::ModelConfig::from_toml(r);
  const OptimizerConfig oc = muon_config();  // Muon for the hidden and expert matrices, as ZAYA1 trained
  const std::vector<model::ParamSpec> specs = model::parameter_specs(mc);
  for (int world : {8, 64, 1024}) {
    SCOPED_TRACE(world);
    const ShardPlan plan = plan_shards(specs, offsets_of(specs), oc, world);
    check_plan(plan, specs, oc, world);
    EXPECT_LT(plan.state_imbalance(), world <= 64 ? 1.05 : 3.0);
    std::printf("ZAYA1-base over %d ranks: state max/mean %.3f, Newton-Schulz max/mean %.3f\n", world,
                plan.state_imbalance(), plan.ns_imbalance());
  }
}

}  // namespace
}  // namespace zaya::optim
