#include "zaya/sizing/dp_scaling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "zaya/core/error.h"
#include "zaya/dist/bucket_plan.h"
#include "zaya/model/params.h"
#include "zaya/optim/config.h"
#include "zaya/optim/shard_plan.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::sizing {

// ---- presets ----

std::vector<std::string> cluster_preset_names() { return {"mi300x-pollara", "h100-ib"}; }

ClusterPreset cluster_preset(const std::string& name, const std::string& flag) {
  ClusterPreset p;
  p.name = name;
  p.cluster.nodes = 128;  // ZAYA1's cluster: 128 nodes of 8 GPUs
  p.cluster.gpus_per_node = 8;
  p.cluster.nics_per_node = 8;
  p.cluster.nic_gbps = 400;
  if (name == "mi300x-pollara") {
    // REFERENCES.md: 8 Pollara 400 NICs per node, rails-only; 7 xGMI links of ~48 GB/s usable.
    p.cluster.topology = Topology::rails_only;
    p.cluster.intra_gbs = 7 * 48;
    p.hw = "mi300x";
    p.description = "MI300X nodes of 8, xGMI 7 x 48 GB/s, 8 x 400 Gb/s Pollara NICs, rails-only";
    return p;
  }
  if (name == "h100-ib") {
    // DGX H100-style: NVLink 450 GB/s per direction, 8 x 400 Gb/s NDR InfiniBand, fat-tree.
    p.cluster.topology = Topology::fat_tree;
    p.cluster.intra_gbs = 450;
    p.hw = "h100";
    p.description = "H100 nodes of 8, NVLink 450 GB/s, 8 x 400 Gb/s NDR InfiniBand, fat-tree";
    return p;
  }
  std::string names;
  for (const auto& n : cluster_preset_names()) names += (names.empty() ? "" : " or ") + n;
  throw Error("unknown cluster preset", {.field = flag, .expected = names, .found = name});
}

// ---- compute ----

MicroBatchCompute micro_batch_compute(const model::ModelConfig& m, int64_t tokens, int64_t seq, const HardwareProfile& hw) {
  MicroBatchCompute c;
  double layers_backward = 0;
  for (const auto& g : model_gemms(m, tokens)) {
    const double t = g.flops() / gemm_rate(hw, g.m, g.n, g.k);
    if (g.pass == GemmPass::forward)
      c.forward_s += t;
    else if (g.name == "lm_head")
      c.head_backward_s += t;
    else
      layers_backward += t;
  }
  // Attention: forward computes scores and values once, backward twice that (the convention of
  // attention_flops' factor 6 = 2 forward + 4 backward).
  const double attention = attention_flops(m, tokens, seq) / gemm_rate(hw, seq, seq, m.head_dim);
  c.forward_s += attention / 3;
  layers_backward += 2 * attention / 3;
  c.backward_s = c.head_backward_s + layers_backward;
  c.layer_backward_s = layers_backward / std::max<int64_t>(1, m.num_hidden_layers);
  return c;
}

std::vector<double> report_ready_times(const MicroBatchCompute& c, size_t reports) {
  ZAYA_CHECK(reports >= 3, "report_ready_times: a report order holds the final norm, the layers and the embedding; found ",
             reports, " reports");
  const size_t layers = reports - 2;
  const double per_layer = (c.backward_s - c.head_backward_s) / static_cast<double>(layers);
  std::vector<double> t(reports);
  t[0] = c.head_backward_s;  // the final norm's gradient is final once the head's backward is done
  for (size_t k = 1; k <= layers; ++k) t[k] = c.head_backward_s + static_cast<double>(k) * per_layer;
  t[reports - 1] = c.backward_s;  // the embedding: the lookup's backward ends backward
  return t;
}

// ---- the bucket timeline ----

OverlapResult simulate_bucket_overlap(const std::vector<BucketTask>& buckets, double backward_end_s, double hidden_cap) {
  ZAYA_CHECK(hidden_cap >= 0 && hidden_cap <= 1, "bucket overlap: the hidden fraction cap must be in [0, 1], found ",
             hidden_cap);
  ZAYA_CHECK(backward_end_s >= 0, "bucket overlap: backward must end at a time >= 0, found ", backward_end_s);
  OverlapResult r;
  r.backward_end_s = backward_end_s;
  double queue_end = 0, after_backward = 0, prev_ready = 0;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const BucketTask& b = buckets[k];
    ZAYA_CHECK(b.comm_s >= 0 && b.ready_s >= prev_ready && b.ready_s <= backward_end_s * (1 + 1e-12),
               "bucket overlap: bucket ", k, " is ready at ", b.ready_s, " s with ", b.comm_s,
               " s of communication; buckets must be ready in order, no later than backward ends (", backward_end_s,
               " s), with communication >= 0");
    prev_ready = b.ready_s;
    // The part that may overlap backward waits in the network's queue; the rest runs only once
    // backward has ended.
    queue_end = std::max(queue_end, b.ready_s) + hidden_cap * b.comm_s;
    after_backward += (1 - hidden_cap) * b.comm_s;
    r.comm_s += b.comm_s;
  }
  // Every bucket is ready by the end of backward, so from then on the network is busy without a
  // gap until the last collective ends: that whole span is exposed.
  r.comm_end_s = std::max(queue_end, backward_end_s) + after_backward;
  r.exposed_s = r.comm_end_s - backward_end_s;
  r.hidden_s = r.comm_s - r.exposed_s;
  return r;
}

// ---- collectives of the trainer ----

double grouped_chain_time(const ClusterSpec& c, double bytes) {
  const int n = c.ranks();
  if (n <= 1 || bytes <= 0) return 0;
  double latency = 0, bw = 1e300;
  if (c.gpus_per_node > 1) {
    const Hop in = intra_hop(c);
    latency += static_cast<double>(c.nodes) * (c.gpus_per_node - 1) * in.alpha_s;
    bw = std::min(bw, in.bytes_per_s);
  }
  if (c.nodes > 1) {
    const Hop out = inter_hop(c, 1, false);
    latency += static_cast<double>(c.nodes - 1) * out.alpha_s;
    bw = std::min(bw, out.bytes_per_s);
  }
  return latency + bytes / bw;
}

namespace {

double best_time(const ClusterSpec& c, SimColl op, double bytes) {
  double t = 1e300;
  for (SimAlgo a : kSimAlgos)
    if (auto v = collective_time(c, op, a, bytes)) t = std::min(t, *v);
  return t;
}

std::vector<int64_t> contiguous_offsets(const std::vector<model::ParamSpec>& specs) {
  std::vector<int64_t> off;
  int64_t o = 0;
  for (const auto& s : specs) {
    off.push_back(o);
    o += s.shape.numel();
  }
  return off;
}

}  // namespace

OptimizerStepCost optimizer_step_cost(const ClusterSpec& cluster, const model::ModelConfig& m, const HardwareProfile& hw) {
  const auto specs = model::parameter_specs(m);
  const optim::OptimizerConfig config;  // the trainer's defaults: Muon on, 5 Newton–Schulz steps
  const optim::ShardPlan plan = optim::plan_shards(specs, contiguous_offsets(specs), config, cluster.ranks());
  OptimizerStepCost best;
  double worst = -1;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const optim::RankShare& s = plan.ranks[r];
    // state = 8·adamw + 4·muon and elements = adamw + muon.
    const double muon = (8.0 * static_cast<double>(s.elements()) - static_cast<double>(s.state_bytes)) / 4.0;
    const double adamw = static_cast<double>(s.elements()) - muon;
    const double mem = (adamw * kAdamWBytesPerElement + muon * kMuonBytesPerElement) / hw.memory_bandwidth;
    const double ns = s.ns_flops * static_cast<double>(config.muon_ns_steps) / hw.achievable_flops;
    if (mem + ns > worst) {
      worst = mem + ns;
      best.memory_s = mem;
      best.newton_schulz_s = ns;
      best.busiest_rank = static_cast<int>(r);
    }
  }
  best.ns_imbalance = plan.ns_imbalance();
  // The clipping norm (one f64 scalar) and the balancer's expert counts (L × (E+1) int64).
  best.small_collectives_s =
      best_time(cluster, SimColl::all_reduce, 8.0) +
      best_time(cluster, SimColl::all_reduce, 8.0 * static_cast<double>(m.num_hidden_layers * m.router_classes()));
  return best;
}

// ---- the step ----

WireDType parse_wire_dtype(const std::string& name, const std::string& flag, bool allow_f64) {
  if (name == "f32") return WireDType::f32;
  if (name == "bf16") return WireDType::bf16;
  if (name == "f64" && allow_f64) return WireDType::f64;
  throw Error("unknown wire type", {.field = flag, .expected = allow_f64 ? "f32, bf16 or f64" : "f32 or bf16", .found = name});
}

const char* wire_dtype_name(WireDType d) {
  switch (d) {
    case WireDType::bf16: return "bf16";
    case WireDType::f32: return "f32";
    case WireDType::f64: return "f64";
  }
  return "?";
}

double wire_bytes(WireDType d) { return d == WireDType::bf16 ? 2 : d == WireDType::f32 ? 4 : 8; }

void DpOptions::validate() const {
  auto need = [](bool ok, const char* flag, const std::string& found, const char* what) {
    if (!ok) throw Error("invalid value", {.field = flag, .expected = what, .found = found});
  };
  need(global_batch >= 1, "--global-batch", std::to_string(global_batch), "at least 1 sequence");
  need(micro_batch >= 1, "--mbs", std::to_string(micro_batch), "at least 1 sequence");
  need(seq >= 1, "--seq", std::to_string(seq), "at least 1 token");
  need(bucket_mb > 0 && bucket_mb <= 4096, "--bucket-mb", str(bucket_mb), "in (0, 4096] MiB, as parallel.bucket_mb");
  need(hidden_cap >= 0 && hidden_cap <= 1, "--hidden-fraction", str(hidden_cap), "a fraction in [0, 1]");
}

DpStepRow dp_step(const ClusterSpec& cluster, const model::ModelConfig& m, const DpOptions& o, const HardwareProfile& hw) {
  o.validate();
  DpStepRow r;
  r.gpus = cluster.ranks();
  r.nodes = cluster.nodes;
  const int64_t per_step = o.micro_batch * r.gpus;  // sequences one micro-batch of every GPU covers
  r.grad_accum = (o.global_batch + per_step - 1) / per_step;
  r.batch_grows = o.global_batch < per_step;
  r.batch_rounded = !r.batch_grows && o.global_batch % per_step != 0;
  r.tokens_per_gpu = r.grad_accum * o.micro_batch * o.seq;

  const MicroBatchCompute mb = micro_batch_compute(m, o.micro_batch * o.seq, o.seq, hw);
  r.compute_s = static_cast<double>(r.grad_accum) * mb.total_s();
  r.last_backward_s = mb.backward_s;

  // The trainer's bucket plan on the model's report order; each bucket ready when its last report
  // lands, its collective a grouped chain of its wire bytes.
  const auto specs = model::parameter_specs(m);
  const auto order = model::gradient_report_order(specs);
  const auto bucket_elements = static_cast<int64_t>(o.bucket_mb * 1048576.0 / 4);
  const auto buckets = dist::plan_buckets(order, bucket_elements);
  const auto ready = report_ready_times(mb, order.size());
  std::vector<BucketTask> tasks;
  for (const auto& b : buckets)
    tasks.push_back({ready[b.last_report], grouped_chain_time(cluster, static_cast<double>(b.elements()) * wire_bytes(o.grad_wire))});
  r.buckets = static_cast<int>(buckets.size());
  r.rs = simulate_bucket_overlap(tasks, mb.backward_s, o.hidden_cap);

  int64_t numel = 0;
  for (const auto& s : specs) numel += s.shape.numel();
  r.gather_s = grouped_chain_time(cluster, static_cast<double>(numel) * wire_bytes(o.gather_wire));
  // Prefetched: the next step's first forward needs each layer's parameters as it reaches it, so
  // the gather hides behind one micro-batch's forward at most.
  r.gather_exposed_s = o.prefetch_gather ? std::max(0.0, r.gather_s - mb.forward_s) : r.gather_s;

  r.optimizer = optimizer_step_cost(cluster, m, hw);
  r.step_s = r.compute_s + r.rs.exposed_s + r.optimizer.total_s() + r.gather_exposed_s;
  return r;
}

std::vector<DpStepRow> dp_scaling(const ClusterSpec& cluster, const model::ModelConfig& m, const DpOptions& o,
                                  const HardwareProfile& hw, const std::vector<int>& gpu_counts) {
  std::vector<DpStepRow> rows;
  for (int g : gpu_counts) {
    ZAYA_CHECK(g >= 1, "dp_scaling: GPU counts must be positive, found ", g);
    ClusterSpec c = cluster;
    if (g < c.gpus_per_node) {
      c.gpus_per_node = g;
      c.nodes = 1;
    } else {
      ZAYA_CHECK(g % c.gpus_per_node == 0, "dp_scaling: ", g, " GPUs is not a whole number of nodes of ", c.gpus_per_node);
      c.nodes = g / c.gpus_per_node;
    }
    rows.push_back(dp_step(c, m, o, hw));
  }
  return rows;
}

std::string format_dp_scaling(const std::vector<DpStepRow>& rows) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "#%6s %5s %6s %9s %9s %9s %9s %9s %9s %9s %10s %8s %8s\n", "gpus", "nodes", "accum",
                "compute", "bwd last", "RS", "RS exp", "AG exp", "optim", "step s", "tok/s/GPU", "eff", "comp/st");
  out << line;
  const double base = rows.empty() ? 0 : rows.front().tokens_per_s_per_gpu();
  for (const auto& r : rows) {
    const char* mark = r.batch_grows ? "*" : r.batch_rounded ? "~" : "";
    std::snprintf(line, sizeof line, " %6d %5d %5lld%1s %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10.0f %7.1f%% %7.1f%%\n",
                  r.gpus, r.nodes, static_cast<long long>(r.grad_accum), mark, r.compute_s, r.last_backward_s, r.rs.comm_s,
                  r.rs.exposed_s, r.gather_exposed_s, r.optimizer.total_s(), r.step_s, r.tokens_per_s_per_gpu(),
                  100 * r.tokens_per_s_per_gpu() / base, 100 * r.compute_fraction());
    out << line;
  }
  return out.str();
}

// ---- the measured overlap ----

double median_hidden_fraction(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  if (!in) throw Error("cannot open metrics file", {.file = metrics_path});
  std::vector<double> v;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error("not a JSON record", {.file = metrics_path, .field = str("line ", line_no), .expected = "one JSON object per line",
                                        .found = line.substr(0, 80)});
    }
    if (!j.is_object() || !j.contains("data_parallel")) continue;
    const auto& dp = j["data_parallel"];
    if (!dp.is_object() || !dp.contains("hidden_fraction") || !dp["hidden_fraction"].is_number())
      throw Error("data_parallel record without a numeric hidden_fraction",
                  {.file = metrics_path, .field = str("line ", line_no), .expected = "data_parallel.hidden_fraction",
                   .found = dp.dump().substr(0, 80)});
    const double f = dp["hidden_fraction"].get<double>();
    if (!(f >= 0 && f <= 1))
      throw Error("hidden_fraction outside [0, 1]", {.file = metrics_path, .field = str("line ", line_no), .found = str(f)});
    v.push_back(f);
  }
  if (v.empty())
    throw Error("no data-parallel step records", {.file = metrics_path,
                                                  .expected = "records with data_parallel.hidden_fraction (a run of more than one rank)"});
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace zaya::sizing
