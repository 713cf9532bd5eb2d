// The trainer-faithful data-parallel scaling model (src/zaya/sizing/dp_scaling.h): the bucket
// timeline on hand-computable cases, the chain cost, the plan it prices, sanity of the scaling
// table on ZAYA1-base, the metrics reader and the CLI's flag errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "test_util.h"
#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/dist/bucket_plan.h"
#include "zaya/model/params.h"
#include "zaya/sizing/dp_scaling.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::sizing {
namespace {

using zaya::test::error_of;

// The timeline adds and takes maxima of a handful of doubles: only rounding of the last bits.
constexpr double kExact = 1e-12;

model::ModelConfig zaya1_base() {
  ConfigReader r = ConfigReader::from_file(std::string(ZAYA_SOURCE_DIR) + "/configs/zaya1-base.toml", {});
  return model::ModelConfig::from_toml(r);
}

// Three equal buckets ready at 1, 2 and 3 s; backward ends at 3 s; each collective takes 1.5 s.
// Queue: [1, 2.5], [2.5, 4], [4, 5.5] -> exposed 5.5 - 3 = 2.5 s, hidden 4.5 - 2.5 = 2 s.
TEST(BucketTimeline, ThreeEqualBucketsQueueBehindEachOther) {
  const std::vector<BucketTask> b = {{1, 1.5}, {2, 1.5}, {3, 1.5}};
  const OverlapResult r = simulate_bucket_overlap(b, 3.0, 1.0);
  EXPECT_NEAR(r.comm_end_s, 5.5, kExact);
  EXPECT_NEAR(r.exposed_s, 2.5, kExact);
  EXPECT_NEAR(r.comm_s, 4.5, kExact);
  EXPECT_NEAR(r.hidden_s, 2.0, kExact);
}

// A fast network: each bucket ends before the next is ready; only the last one (ready when
// backward ends) is exposed.
TEST(BucketTimeline, AFastNetworkExposesOnlyTheLastBucket) {
  const std::vector<BucketTask> b = {{1, 0.25}, {2, 0.25}, {3, 0.25}};
  const OverlapResult r = simulate_bucket_overlap(b, 3.0, 1.0);
  EXPECT_NEAR(r.exposed_s, 0.25, kExact);
  EXPECT_NEAR(r.hidden_s, 0.5, kExact);
}

// Cap 0.5: the hideable halves (0.75 s) queue at [1, 1.75], [2, 2.75], [3, 3.75]; the other
// halves (3 x 0.75 s) run after backward and after that queue: 3.75 + 2.25 = 6 -> exposed 3 s.
// Cap 0: everything after backward: exposed = 4.5 s.
TEST(BucketTimeline, AHiddenFractionCapDelaysTheRestUntilBackwardEnds) {
  const std::vector<BucketTask> b = {{1, 1.5}, {2, 1.5}, {3, 1.5}};
  const OverlapResult half = simulate_bucket_overlap(b, 3.0, 0.5);
  EXPECT_NEAR(half.comm_end_s, 6.0, kExact);
  EXPECT_NEAR(half.exposed_s, 3.0, kExact);
  EXPECT_NEAR(half.hidden_s, 1.5, kExact);
  const OverlapResult none = simulate_bucket_overlap(b, 3.0, 0.0);
  EXPECT_NEAR(none.exposed_s, 4.5, kExact);
  EXPECT_NEAR(none.hidden_s, 0.0, kExact);
}

TEST(BucketTimeline, BadInputsAreRefused) {
  const std::vector<BucketTask> ok = {{1, 1}, {2, 1}};
  EXPECT_NE(error_of([&] { simulate_bucket_overlap(ok, 3, 1.5); }).find("cap"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_bucket_overlap(ok, 3, -0.1); }).find("cap"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_bucket_overlap({{2, 1}, {1, 1}}, 3, 1); }).find("bucket 1"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_bucket_overlap({{1, 1}, {4, 1}}, 3, 1); }).find("bucket 1"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_bucket_overlap({{1, -1}}, 3, 1); }).find("bucket 0"), std::string::npos);
}

// One node of 4 GPUs: 3 intra hops. Two rails-only nodes of 4: 2 x 3 intra hops and one inter
// hop; the bytes cross the slower of the intra fabric and the node's NICs (8 x 100 Gb/s = 100 GB/s).
TEST(GroupedChain, LatencyPerHopAndBandwidthOfTheSlowestHop) {
  ClusterSpec c;
  c.nodes = 1, c.gpus_per_node = 4, c.intra_gbs = 200, c.intra_latency_us = 1, c.nic_latency_us = 5;
  c.nics_per_node = 8, c.nic_gbps = 100;
  EXPECT_NEAR(grouped_chain_time(c, 1e9), 3e-6 + 1e9 / 200e9, kExact);
  c.nodes = 2;
  EXPECT_NEAR(grouped_chain_time(c, 1e9), 6e-6 + 5e-6 + 1e9 / 100e9, kExact);
  EXPECT_EQ(grouped_chain_time(c, 0), 0);
  c.nodes = 1, c.gpus_per_node = 1;
  EXPECT_EQ(grouped_chain_time(c, 1e9), 0);
}

// The forward/backward split adds up to the sizing model's step compute, and the report times
// follow the report order: the head first, the layers one layer apart, the embedding at the end.
TEST(DpScaling, MicroBatchComputeSplitsTheSizingModelsCompute) {
  const auto m = zaya1_base();
  const auto hw = builtin_profile("mi300x");
  const MicroBatchCompute c = micro_batch_compute(m, 4096, 4096, hw);
  const double want = predicted_compute_seconds(m, 4096, 4096, hw);
  EXPECT_NEAR(c.total_s(), want, 1e-12 * want);
  EXPECT_GT(c.backward_s, 1.5 * c.forward_s);  // backward is about twice the forward
  const auto order = model::gradient_report_order(model::parameter_specs(m));
  ASSERT_EQ(order.size(), static_cast<size_t>(m.num_hidden_layers) + 2);
  const auto t = report_ready_times(c, order.size());
  EXPECT_NEAR(t.front(), c.head_backward_s, kExact);
  EXPECT_NEAR(t[2] - t[1], c.layer_backward_s, 1e-9 * c.layer_backward_s);
  EXPECT_NEAR(t.back(), c.backward_s, kExact);
  for (size_t k = 1; k < t.size(); ++k) EXPECT_GE(t[k], t[k - 1]);
}

// The step prices the trainer's own bucket plan, each bucket a grouped chain of its bytes.
TEST(DpScaling, StepUsesTheTrainersBucketPlan) {
  const auto m = zaya1_base();
  const auto hw = builtin_profile("mi300x");
  const ClusterPreset p = cluster_preset("mi300x-pollara", "--cluster");
  DpOptions o;
  const DpStepRow r = dp_step(p.cluster, m, o, hw);
  const auto specs = model::parameter_specs(m);
  const auto buckets = dist::plan_buckets(model::gradient_report_order(specs), static_cast<int64_t>(32 * 1048576 / 4));
  ASSERT_EQ(r.buckets, static_cast<int>(buckets.size()));
  double comm = 0;
  for (const auto& b : buckets) comm += grouped_chain_time(p.cluster, 4.0 * static_cast<double>(b.elements()));
  EXPECT_NEAR(r.rs.comm_s, comm, 1e-12 * comm);
  EXPECT_EQ(r.grad_accum, 4);  // 4096 sequences / (1 x 1024 GPUs)
  EXPECT_NEAR(r.step_s, r.compute_s + r.rs.exposed_s + r.gather_exposed_s + r.optimizer.total_s(), 1e-12 * r.step_s);
  // The last bucket (the embedding) is ready only when backward ends: something is always exposed.
  EXPECT_GT(r.rs.exposed_s, 0);
  // bf16 on the wire halves the bandwidth term of every bucket; prefetching can only hide.
  DpOptions bf = o;
  bf.grad_wire = WireDType::bf16;
  bf.prefetch_gather = true;
  const DpStepRow h = dp_step(p.cluster, m, bf, hw);
  EXPECT_LT(h.rs.comm_s, r.rs.comm_s);
  EXPECT_GT(h.rs.comm_s, 0.5 * r.rs.comm_s);
  EXPECT_LE(h.gather_exposed_s, h.gather_s);
  EXPECT_EQ(h.gather_s, r.gather_s);
}

// Sanity of the table on both presets: compute per GPU falls exactly as 1/N (the same
// micro-batch, fewer of them), per-GPU throughput never rises with N, exposed communication never
// falls, efficiency stays in (0, 1].
TEST(DpScaling, EfficiencyFallsMonotonicallyWithTheGlobalBatchFixed) {
  const auto m = zaya1_base();
  for (const char* name : {"mi300x-pollara", "h100-ib"}) {
    const ClusterPreset p = cluster_preset(name, "--cluster");
    const auto rows = dp_scaling(p.cluster, m, DpOptions{}, builtin_profile(p.hw), {8, 16, 32, 64, 128, 256, 512, 1024});
    ASSERT_EQ(rows.size(), 8u);
    for (size_t i = 1; i < rows.size(); ++i) {
      SCOPED_TRACE(std::string(name) + " " + std::to_string(rows[i].gpus));
      EXPECT_NEAR(rows[i].compute_s * rows[i].gpus, rows[0].compute_s * rows[0].gpus, 1e-12 * rows[0].compute_s * 8);
      EXPECT_LE(rows[i].tokens_per_s_per_gpu(), rows[i - 1].tokens_per_s_per_gpu());
      EXPECT_GE(rows[i].rs.exposed_s + rows[i].gather_exposed_s, rows[i - 1].rs.exposed_s + rows[i - 1].gather_exposed_s);
      EXPECT_GT(rows[i].compute_fraction(), 0);
      EXPECT_LE(rows[i].compute_fraction(), 1);
    }
  }
}

// Fewer sequences than GPUs: one micro-batch each, the batch grows (flagged); not a multiple:
// rounded up to whole micro-batches (flagged).
TEST(DpScaling, BatchesThatDoNotSplitAreFlagged) {
  const auto m = zaya1_base();
  ClusterSpec c = cluster_preset("h100-ib", "--cluster").cluster;
  DpOptions o;
  o.global_batch = 512;
  const auto rows = dp_scaling(c, m, o, builtin_profile("h100"), {256, 512, 1024});
  EXPECT_EQ(rows[0].grad_accum, 2);
  EXPECT_FALSE(rows[0].batch_grows || rows[0].batch_rounded);
  EXPECT_EQ(rows[2].grad_accum, 1);
  EXPECT_TRUE(rows[2].batch_grows);
  o.global_batch = 600;
  const DpStepRow r = dp_scaling(c, m, o, builtin_profile("h100"), {256}).front();
  EXPECT_EQ(r.grad_accum, 3);
  EXPECT_TRUE(r.batch_rounded);
  EXPECT_NE(format_dp_scaling({r}).find("3~"), std::string::npos);
}

TEST(DpScaling, PresetsAndOptionsNameTheirFlag) {
  const ClusterPreset a = cluster_preset("mi300x-pollara", "--cluster");
  EXPECT_EQ(a.cluster.topology, Topology::rails_only);
  EXPECT_EQ(a.cluster.ranks(), 1024);
  EXPECT_EQ(a.hw, "mi300x");
  const ClusterPreset b = cluster_preset("h100-ib", "--cluster");
  EXPECT_EQ(b.cluster.topology, Topology::fat_tree);
  EXPECT_EQ(b.cluster.intra_gbs, 450);
  EXPECT_NE(error_of([] { cluster_preset("tpu-pod", "--cluster"); }).find("--cluster"), std::string::npos);
  EXPECT_NE(error_of([] { parse_wire_dtype("f64", "--gather", false); }).find("--gather"), std::string::npos);
  EXPECT_EQ(parse_wire_dtype("f64", "--grad-reduce", true), WireDType::f64);
  DpOptions o;
  o.bucket_mb = 0;
  EXPECT_NE(error_of([&] { o.validate(); }).find("--bucket-mb"), std::string::npos);
  o = DpOptions{};
  o.hidden_cap = 1.5;
  EXPECT_NE(error_of([&] { o.validate(); }).find("--hidden-fraction"), std::string::npos);
  o = DpOptions{};
  o.global_batch = 0;
  EXPECT_NE(error_of([&] { o.validate(); }).find("--global-batch"), std::string::npos);
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DpScaling, MedianHiddenFractionOfAMetricsFile) {
  // Records without data_parallel (a one-rank run, an eval record) are skipped.
  const std::string odd = write_file("dp_odd.jsonl",
                                     "{\"step\":1,\"data_parallel\":{\"hidden_fraction\":0.9}}\n"
                                     "{\"step\":2}\n"
                                     "{\"step\":3,\"data_parallel\":{\"hidden_fraction\":0.2}}\n\n"
                                     "{\"step\":4,\"data_parallel\":{\"hidden_fraction\":0.5}}\n");
  EXPECT_DOUBLE_EQ(median_hidden_fraction(odd), 0.5);
  const std::string even = write_file("dp_even.jsonl",
                                      "{\"data_parallel\":{\"hidden_fraction\":0.25}}\n"
                                      "{\"data_parallel\":{\"hidden_fraction\":0.75}}\n");
  EXPECT_DOUBLE_EQ(median_hidden_fraction(even), 0.5);
  EXPECT_NE(error_of([] { median_hidden_fraction("/nonexistent/metrics.jsonl"); }).find("cannot open"), std::string::npos);
  const std::string none = write_file("dp_none.jsonl", "{\"step\":1}\n");
  EXPECT_NE(error_of([&] { median_hidden_fraction(none); }).find("no data-parallel"), std::string::npos);
  const std::string broken = write_file("dp_broken.jsonl", "{\"data_parallel\":{\"hidden_fraction\":0.5}}\n{oops\n");
  EXPECT_NE(error_of([&] { median_hidden_fraction(broken); }).find("line 2"), std::string::npos);
  const std::string range = write_file("dp_range.jsonl", "{\"data_parallel\":{\"hidden_fraction\":1.5}}\n");
  EXPECT_NE(error_of([&] { median_hidden_fraction(range); }).find("outside"), std::string::npos);
}

// The CLI: the table prints, the goal line says whether it holds, bad flags exit 2 naming them.
TEST(DpScaling, CliPrintsTheTableAndRefusesBadFlags) {
  const std::string model = std::string(" --model ") + ZAYA_SOURCE_DIR + "/configs/zaya1-base.toml";
  const auto ok = zaya::test::run_zaya("simulate --cluster h100-ib --op none --global-batch 4096 --max-gpus 64" + model);
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("# at 64 GPUs: efficiency"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("fat-tree"), std::string::npos) << ok.output;
  const std::string metrics = write_file("dp_cli.jsonl", "{\"data_parallel\":{\"hidden_fraction\":0.25}}\n");
  const auto capped = zaya::test::run_zaya("simulate --cluster h100-ib --op none --global-batch 4096 --max-gpus 16 "
                                           "--overlap-from " + metrics + model);
  ASSERT_EQ(capped.code, 0) << capped.output;
  EXPECT_NE(capped.output.find("hidden-fraction cap 0.250"), std::string::npos) << capped.output;
  // A run config's trainer settings are the flags' defaults; a flag on the command line wins.
  const std::string run = model +
                          " --set train.micro_batch=4 --set 'train.param_dtype=\"bf16\"' --set "
                          "'parallel.grad_reduce=\"bf16\"' --set parallel.bucket_mb=830 --set "
                          "parallel.overlap_param_gather=false";
  const auto from_config = zaya::test::run_zaya("simulate --cluster h100-ib --op none --global-batch 4096 --max-gpus 16" + run);
  ASSERT_EQ(from_config.code, 0) << from_config.output;
  EXPECT_NE(from_config.output.find("micro-batch 4; buckets of 830 MiB f32"), std::string::npos) << from_config.output;
  EXPECT_NE(from_config.output.find("gradients reduced in bf16; parameters gathered in bf16, after the optimizer step"),
            std::string::npos)
      << from_config.output;
  const auto flags_win = zaya::test::run_zaya(
      "simulate --cluster h100-ib --op none --global-batch 4096 --max-gpus 16 --mbs 2 --gather f32 --prefetch-gather" + run);
  ASSERT_EQ(flags_win.code, 0) << flags_win.output;
  EXPECT_NE(flags_win.output.find("micro-batch 2;"), std::string::npos) << flags_win.output;
  EXPECT_NE(flags_win.output.find("parameters gathered in f32, prefetched under the next forward"), std::string::npos)
      << flags_win.output;

  const std::pair<const char*, const char*> bad[] = {
      {"--cluster tpu-pod --global-batch 4096", "--cluster"},
      {"--global-batch 4096 --hidden-fraction 1.5", "--hidden-fraction"},
      {"--global-batch 4096 --bucket-mb 0", "--bucket-mb"},
      {"--global-batch 4096 --grad-reduce f16", "--grad-reduce"},
      {"--global-batch 4096 --gather f64", "--gather"},
      {"--global-batch 4096 --hidden-fraction 0.5 --overlap-from x.jsonl", "--overlap-from"},
      {"--global-batch 4096 --overlap-from /nonexistent/m.jsonl", "/nonexistent/m.jsonl"},
      {"--bucket-mb 8", "--bucket-mb"},
  };
  for (const auto& [flags, named] : bad) {
    const auto r = zaya::test::run_zaya(std::string("simulate --op none ") + flags + model);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(named), std::string::npos) << flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace zaya::sizing
