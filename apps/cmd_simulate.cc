// `zaya simulate`: collectives and ZeRO-1 data-parallel scaling on a modelled cluster
// (src/zaya/sizing/cluster_sim.h; docs/simulate.md). Command-line wiring and printing only.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/dist/collective_math.h"
#include "zaya/model/config.h"
#include "zaya/sizing/cluster_sim.h"
#include "zaya/sizing/dp_scaling.h"
#include "zaya/sizing/goodput.h"

namespace zaya::app {
namespace {

struct SimulateFlags {
  sizing::ClusterSpec cluster;
  std::string topology = "rails-only";
  std::string op = "all";
  std::string b = "8", e = "1G";
  uint64_t f = 2;
  std::string model, hw = "h100";
  std::vector<std::string> overrides;
  int64_t mbs = 1, seq = 4096;
  int max_gpus = 4096;
  std::string calibrate, compare, fit_min = "0";
  // The trainer's data-parallel step (dp_scaling.h).
  std::string preset;
  int64_t global_batch = 0;  // sequences; 0: the weak-scaling table instead
  double bucket_mb = 32;
  std::string grad_reduce = "f32", gather = "f32";
  bool prefetch_gather = true;  // the trainer's default (parallel.overlap_param_gather)
  std::string overlap_from;
  double hidden_fraction = 1;
  bool hidden_fraction_given = false;
  // Goodput under failures (goodput.h).
  bool goodput = false;
  sizing::GoodputModel failures;
};

model::ModelConfig load_model(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.size() > 5 && path.substr(path.size() - 5) == ".json") return model::ModelConfig::from_hf_json(path);
  ConfigReader r = ConfigReader::from_file(path, overrides);
  return model::ModelConfig::from_toml(r);
}

// With a TOML run config, the trainer's own settings are the defaults of the flags that model them
// (a flag given on the command line wins): simulate the run that config launches.
void apply_run_config(SimulateFlags& fl, const CLI::App& cmd) {
  if (fl.model.empty() || (fl.model.size() > 5 && fl.model.substr(fl.model.size() - 5) == ".json")) return;
  ConfigReader r = ConfigReader::from_file(fl.model, fl.overrides);
  const auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  if (!given("--mbs")) r.get("train.micro_batch", fl.mbs);
  if (!given("--seq")) r.get("train.seq_len", fl.seq);
  if (!given("--bucket-mb")) r.get("parallel.bucket_mb", fl.bucket_mb);
  if (!given("--grad-reduce")) r.get("parallel.grad_reduce", fl.grad_reduce);
  if (!given("--gather") && r.has("train.param_dtype")) {
    std::string param_dtype;
    r.get("train.param_dtype", param_dtype);
    fl.gather = param_dtype == "bf16" ? "bf16" : "f32";  // bf16 weights travel in bf16
  }
  if (!given("--prefetch-gather") && !given("--no-prefetch-gather")) r.get("parallel.overlap_param_gather", fl.prefetch_gather);
}

std::vector<sizing::SimColl> ops_of(const std::string& op) {
  if (op == "none") return {};
  if (op == "all") return {std::begin(sizing::kSimColls), std::end(sizing::kSimColls)};
  return {sizing::parse_sim_coll(op, "--op")};
}

std::vector<double> sizes_of(const SimulateFlags& fl) {
  const uint64_t lo = dist::parse_size(fl.b, "-b"), hi = dist::parse_size(fl.e, "-e");
  if (lo == 0 || lo > hi)
    throw Error("invalid size range", {.field = "-b/-e", .expected = "0 < min <= max", .found = fl.b + " .. " + fl.e});
  if (fl.f < 2) throw Error("invalid size factor", {.field = "-f", .expected = "at least 2", .found = std::to_string(fl.f)});
  std::vector<double> out;
  for (uint64_t s : dist::sweep_sizes(lo, hi, fl.f, 0)) out.push_back(static_cast<double>(s));
  return out;
}

// The calibration of `op` whose rank count is nearest to `ranks`.
const sizing::Calibration* nearest(const std::vector<sizing::Calibration>& cals, const std::string& op, int ranks) {
  const sizing::Calibration* best = nullptr;
  for (const auto& c : cals)
    if (c.op == op && (!best || std::abs(c.ranks - ranks) < std::abs(best->ranks - ranks))) best = &c;
  return best;
}

int run_calibrated(const SimulateFlags& fl, bool ranks_given) {
  const double min_bytes = static_cast<double>(dist::parse_size(fl.fit_min, "--fit-min-bytes"));
  const auto samples = sizing::read_collectives_csv(fl.calibrate);
  const auto cals = sizing::calibrate(samples, min_bytes);
  char line[256];
  std::cout << "# calibration: least squares t = alpha + S * beta on " << fl.calibrate << " (out-of-place, sizes >= "
            << static_cast<long long>(min_bytes) << " B, weights 1/t^2)\n";
  std::snprintf(line, sizeof line, "#%15s %5s %6s %12s %14s %12s %10s\n", "op", "ranks", "points", "alpha (us)",
                "beta (us/MiB)", "hop alpha us", "hop GB/s");
  std::cout << line;
  for (const auto& c : cals) {
    std::snprintf(line, sizeof line, " %15s %5d %6d %12.2f %14.1f %12.3f %10.3f\n", c.op.c_str(), c.ranks, c.fit.points,
                  c.fit.alpha_s * 1e6, c.fit.beta_s_per_byte * 1e6 * 1048576.0, c.hop.alpha_s * 1e6, c.hop.bytes_per_s / 1e9);
    std::cout << line;
  }
  // The one-node "cluster" of those ranks (or of --gpus-per-node ranks: an extrapolation).
  const auto sizes = sizes_of(fl);
  for (sizing::SimColl op : ops_of(fl.op)) {
    const std::string name = sizing::sim_coll_name(op);
    const auto* cal = nearest(cals, name, ranks_given ? fl.cluster.gpus_per_node : 0);
    if (!cal) continue;
    const int n = ranks_given ? fl.cluster.gpus_per_node : cal->ranks;
    std::cout << "\n# " << name << ", calibrated one-node ring, " << n << " ranks (fit on " << cal->ranks << ")\n";
    std::snprintf(line, sizeof line, "#%14s %12s %12s %9s\n", "size (B)", "count", "time (us)", "busbw");
    std::cout << line;
    for (double s : sizes) {
      const double t = sizing::calibrated_time(*cal, n, s);
      std::snprintf(line, sizeof line, " %14.0f %12.0f %12.2f %9.3f\n", s, std::floor(s / 4), t * 1e6,
                    s / t / 1e9 * sizing::sim_bus_factor(op, n));
      std::cout << line;
    }
  }
  // Prediction against a measurement (--compare, else the calibration file itself).
  const std::string against = fl.compare.empty() ? fl.calibrate : fl.compare;
  const auto measured = fl.compare.empty() ? samples : sizing::read_collectives_csv(fl.compare);
  std::cout << "\n# predicted vs measured out-of-place busbw (" << against << "), sizes >= 1 MiB\n";
  std::snprintf(line, sizeof line, "#%15s %5s %14s %12s %12s %8s\n", "op", "ranks", "size (B)", "measured", "predicted",
                "error");
  std::cout << line;
  std::map<std::string, std::pair<int, int>> within;  // op -> (within 20%, sizes)
  for (const auto& m : measured) {
    if (m.bytes < 1048576.0) continue;
    const auto* cal = nearest(cals, m.op, m.ranks);
    if (!cal) continue;
    sizing::SimColl op = sizing::parse_sim_coll(m.op, against);
    if (fl.op != "all" && m.op != fl.op) continue;
    const double f = sizing::sim_bus_factor(op, m.ranks);
    const double meas = m.bytes / m.time_s / 1e9 * f, pred = m.bytes / sizing::calibrated_time(*cal, m.ranks, m.bytes) / 1e9 * f;
    const double err = (pred - meas) / meas;
    auto& w = within[m.op];
    w.first += std::abs(err) <= 0.2;
    w.second += 1;
    std::snprintf(line, sizeof line, " %15s %5d %14.0f %12.3f %12.3f %+7.1f%%\n", m.op.c_str(), m.ranks, m.bytes, meas, pred,
                  100 * err);
    std::cout << line;
  }
  for (const auto& [op, w] : within)
    std::cout << "# " << op << ": " << w.first << " of " << w.second << " sizes >= 1 MiB within 20%\n";
  return 0;
}

// The trainer-faithful table (--global-batch): fixed global batch, the bucket timeline, the
// optimizer step and the parameter all-gather at 8, 16, ... GPUs.
int run_data_parallel(const SimulateFlags& fl, const model::ModelConfig& m, const sizing::HardwareProfile& hw) {
  if (!fl.overlap_from.empty() && fl.hidden_fraction_given)
    throw Error("conflicting flags", {.field = "--overlap-from/--hidden-fraction", .expected = "at most one of them",
                                      .found = "both"});
  sizing::DpOptions o;
  o.global_batch = fl.global_batch;
  o.micro_batch = fl.mbs;
  o.seq = fl.seq;
  o.bucket_mb = fl.bucket_mb;
  o.grad_wire = sizing::parse_wire_dtype(fl.grad_reduce, "--grad-reduce", true);
  o.gather_wire = sizing::parse_wire_dtype(fl.gather, "--gather", false);
  o.prefetch_gather = fl.prefetch_gather;
  std::string cap_source = "none: NCCL progresses on its own";
  if (!fl.overlap_from.empty()) {
    o.hidden_cap = sizing::median_hidden_fraction(fl.overlap_from);
    cap_source = "median data_parallel.hidden_fraction of " + fl.overlap_from;
  } else if (fl.hidden_fraction_given) {
    o.hidden_cap = fl.hidden_fraction;
    cap_source = "--hidden-fraction";
  }
  o.validate();
  std::vector<int> counts;
  for (int g = fl.cluster.gpus_per_node; g <= fl.max_gpus; g *= 2) counts.push_back(g);
  if (counts.empty()) counts.push_back(fl.max_gpus);
  const auto rows = sizing::dp_scaling(fl.cluster, m, o, hw, counts);
  char line[512];
  std::cout << "\n# data parallel as the trainer runs it: " << fl.model << " on "
            << (fl.preset.empty() ? std::string("the flags' cluster") : fl.preset) << " ("
            << (fl.cluster.topology == sizing::Topology::rails_only ? "rails-only" : "fat-tree") << ", "
            << fl.cluster.nics_per_node << " x " << fl.cluster.nic_gbps << " Gb/s NICs, intra " << fl.cluster.intra_gbs
            << " GB/s), compute on " << hw.name << "\n";
  std::snprintf(line, sizeof line,
                "# global batch %lld x %lld tokens fixed; micro-batch %lld; buckets of %.0f MiB f32 (%d buckets); gradients "
                "reduced in %s; parameters gathered in %s%s; hidden-fraction cap %.3f (",
                static_cast<long long>(o.global_batch), static_cast<long long>(o.seq), static_cast<long long>(o.micro_batch),
                o.bucket_mb, rows.empty() ? 0 : rows.front().buckets, sizing::wire_dtype_name(o.grad_wire),
                sizing::wire_dtype_name(o.gather_wire), o.prefetch_gather ? ", prefetched under the next forward" : ", after the optimizer step (exposed)",
                o.hidden_cap);
  std::cout << line << cap_source << ")\n";  // a path of any length
  std::cout << "# seconds per step; RS = the buckets' reduce-scatters, RS exp = their part after backward; eff = per-GPU "
               "throughput / the first row's; comp/st = compute / step; accum * = batch grows to mbs x GPUs, ~ = rounded up\n";
  std::cout << sizing::format_dp_scaling(rows);
  if (!rows.empty()) {
    const auto& last = rows.back();
    const double eff = last.tokens_per_s_per_gpu() / rows.front().tokens_per_s_per_gpu();
    const std::pair<const char*, double> terms[] = {{"exposed reduce-scatter", last.rs.exposed_s},
                                                    {"parameter all-gather", last.gather_exposed_s},
                                                    {"optimizer step", last.optimizer.total_s()}};
    const auto* top = &terms[0];
    for (const auto& t : terms)
      if (t.second > top->second) top = &t;
    std::snprintf(line, sizeof line,
                  "# at %d GPUs: efficiency %.1f%% of %d GPUs' per-GPU throughput (goal >= 90%%: %s); largest overhead: %s "
                  "%.4f s of %.4f s per step; Newton-Schulz imbalance %.2f\n",
                  last.gpus, 100 * eff, rows.front().gpus, eff >= 0.9 ? "holds" : "does not hold", top->first, top->second,
                  last.step_s, last.optimizer.ns_imbalance);
    std::cout << line;
  }
  return 0;
}

int run_simulate(SimulateFlags fl, bool ranks_given) {
  if (fl.goodput) {
    fl.failures.validate();
    std::vector<double> intervals;
    for (double minutes : {5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 360.0, 720.0})
      intervals.push_back(60 * minutes);
    std::cout << sizing::format_goodput(fl.failures, intervals);
    return 0;
  }
  fl.cluster.topology = sizing::parse_topology(fl.topology, "--topology");
  fl.cluster.validate();
  const auto ops = ops_of(fl.op);
  if (!fl.calibrate.empty()) return run_calibrated(fl, ranks_given);
  const auto sizes = ops.empty() ? std::vector<double>{} : sizes_of(fl);
  if (fl.model.empty() && fl.global_batch != 0)
    throw Error("missing flag", {.field = "--global-batch", .expected = "--model CONFIG with it"});
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) std::cout << "\n";
    std::cout << sizing::format_sweep(fl.cluster, ops[i], sizing::simulate_sweep(fl.cluster, ops[i], sizes));
  }
  if (fl.model.empty()) return 0;

  const model::ModelConfig m = load_model(fl.model, fl.overrides);
  const sizing::HardwareProfile hw = sizing::resolve_profile(fl.hw);
  if (fl.max_gpus < 1) throw Error("invalid value", {.field = "--max-gpus", .expected = "at least 1", .found = std::to_string(fl.max_gpus)});
  if (fl.global_batch != 0) return run_data_parallel(fl, m, hw);
  const int64_t tokens = fl.mbs * fl.seq;
  char line[256];
  std::cout << "\n# ZeRO-1 data parallel: " << fl.model << ", micro-batch " << fl.mbs << " x " << fl.seq
            << " per GPU (weak scaling), compute on " << hw.name << "; reduce-scatter fp32 grads + all-gather bf16 weights\n";
  std::snprintf(line, sizeof line, "#%7s %6s %11s %9s %9s %12s %10s %12s %10s\n", "gpus", "nodes", "compute s", "RS s",
                "AG s", "step s", "eff", "overlap s", "eff");
  std::cout << line;
  std::vector<int> counts;
  for (int g = fl.cluster.gpus_per_node; g <= std::max(fl.max_gpus, fl.cluster.ranks()); g *= 2) counts.push_back(g);
  if (std::find(counts.begin(), counts.end(), fl.cluster.ranks()) == counts.end()) counts.push_back(fl.cluster.ranks());
  std::sort(counts.begin(), counts.end());
  for (int g : counts) {
    sizing::ClusterSpec c = fl.cluster;
    c.nodes = std::max(1, g / c.gpus_per_node);
    const auto r = sizing::zero1_step(c, m, tokens, fl.seq, hw);
    std::snprintf(line, sizeof line, " %7d %6d %11.4f %9.4f %9.4f %12.4f %9.1f%% %12.4f %9.1f%%\n", c.ranks(), c.nodes,
                  r.compute_s, r.reduce_scatter_s, r.all_gather_s, r.step_no_overlap_s, 100 * r.efficiency_no_overlap,
                  r.step_overlap_s, 100 * r.efficiency_overlap);
    std::cout << line;
  }
  return 0;
}

// A --cluster preset fills the cluster flags, the topology and --hw that were not given.
void apply_preset(SimulateFlags& fl, const CLI::App& cmd) {
  if (fl.preset.empty()) return;
  const sizing::ClusterPreset p = sizing::cluster_preset(fl.preset, "--cluster");
  auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  auto& c = fl.cluster;
  if (!given("--nodes")) c.nodes = p.cluster.nodes;
  if (!given("--gpus-per-node")) c.gpus_per_node = p.cluster.gpus_per_node;
  if (!given("--topology")) fl.topology = p.cluster.topology == sizing::Topology::rails_only ? "rails-only" : "fat-tree";
  if (!given("--nics-per-node")) c.nics_per_node = p.cluster.nics_per_node;
  if (!given("--nic-gbps")) c.nic_gbps = p.cluster.nic_gbps;
  if (!given("--intra-gbps")) c.intra_gbs = p.cluster.intra_gbs;
  if (!given("--latency-us")) c.nic_latency_us = p.cluster.nic_latency_us;
  if (!given("--intra-latency-us")) c.intra_latency_us = p.cluster.intra_latency_us;
  if (!given("--switch-latency-us")) c.switch_latency_us = p.cluster.switch_latency_us;
  if (!given("--hw")) fl.hw = p.hw;
  if (!given("--max-gpus")) fl.max_gpus = p.cluster.ranks();
}

void add_simulate(CLI::App& app, Commands& commands) {
  auto fl = std::make_shared<SimulateFlags>();
  auto* cmd = app.add_subcommand("simulate", "Simulate collectives and data-parallel scaling on a cluster");
  auto& c = fl->cluster;
  cmd->add_option("--nodes", c.nodes, "Nodes")->capture_default_str();
  auto* gpn = cmd->add_option("--gpus-per-node", c.gpus_per_node, "GPUs per node (with --calibrate: ranks to predict)")
                  ->capture_default_str();
  cmd->add_option("--topology", fl->topology, "rails-only or fat-tree")->capture_default_str();
  cmd->add_option("--nics-per-node", c.nics_per_node, "NICs per node")->capture_default_str();
  cmd->add_option("--nic-gbps", c.nic_gbps, "Gbit/s per NIC, one direction")->capture_default_str();
  cmd->add_option("--intra-gbps", c.intra_gbs, "GB/s per GPU to its node peers, one direction")->capture_default_str();
  cmd->add_option("--latency-us", c.nic_latency_us, "Inter-node hop latency (NIC to NIC, one switch)")->capture_default_str();
  cmd->add_option("--intra-latency-us", c.intra_latency_us, "Intra-node hop latency")->capture_default_str();
  cmd->add_option("--switch-latency-us", c.switch_latency_us, "Each extra switch hop (fat-tree spine)")->capture_default_str();
  cmd->add_option("--cluster", fl->preset,
                  "preset cluster: mi300x-pollara or h100-ib (128 nodes of 8; sets the cluster flags and --hw not given)");
  cmd->add_option("--op", fl->op, "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, all or none")
      ->capture_default_str();
  cmd->add_option("-b,--minbytes", fl->b, "Smallest size (K/M/G suffixes)")->capture_default_str();
  cmd->add_option("-e,--maxbytes", fl->e, "Largest size")->capture_default_str();
  cmd->add_option("-f,--stepfactor", fl->f, "Size multiplier between rows")->capture_default_str();
  cmd->add_option("--model", fl->model, "TOML run config or config.json: also print ZeRO-1 scaling");
  cmd->add_option("--set", fl->overrides, "override a config key: model.hidden_size=1024");
  cmd->add_option("--hw", fl->hw, "compute profile for --model: mi300x, h100, h200 or a profile .json")->capture_default_str();
  cmd->add_option("--mbs", fl->mbs, "micro-batch per GPU (sequences)")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq", fl->seq, "sequence length")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--max-gpus", fl->max_gpus, "largest GPU count of the scaling table")->capture_default_str();
  cmd->add_option("--global-batch", fl->global_batch,
                  "with --model: the trainer's step at this fixed global batch (sequences), split over the GPUs by "
                  "gradient accumulation");
  cmd->add_option("--bucket-mb", fl->bucket_mb, "with --global-batch: gradient bucket size, MiB of f32 (parallel.bucket_mb)")
      ->capture_default_str();
  cmd->add_option("--grad-reduce", fl->grad_reduce, "with --global-batch: gradient wire type f32, bf16 or f64")
      ->capture_default_str();
  cmd->add_option("--gather", fl->gather,
                  "with --global-batch: parameter all-gather type f32 or bf16 (the trainer's with train.param_dtype = "
                  "\"bf16\")")
      ->capture_default_str();
  cmd->add_flag("--prefetch-gather,!--no-prefetch-gather", fl->prefetch_gather,
                "with --global-batch: the all-gather runs under the next step's first forward "
                "(parallel.overlap_param_gather, the trainer's default)");
  cmd->add_option("--overlap-from", fl->overlap_from,
                  "with --global-batch: cap hidden communication at the median data_parallel.hidden_fraction of a "
                  "zaya train metrics.jsonl");
  cmd->add_option("--hidden-fraction", fl->hidden_fraction,
                  "with --global-batch: cap the fraction of each bucket's communication that can hide behind backward");
  cmd->add_flag("--goodput", fl->goodput,
               "goodput under failures against the checkpoint interval (docs/aegis.md, \"Goodput at scale\")");
  cmd->add_option("--gpus", fl->failures.gpus, "with --goodput: GPUs in the run")->capture_default_str();
  cmd->add_option("--failures-per-gpu-hour", fl->failures.failures_per_gpu_hour,
                  "with --goodput: failure rate (default: Llama 3's 419 in 54 days on 16,384 GPUs)")
      ->capture_default_str();
  cmd->add_option("--ckpt-stall-s", fl->failures.ckpt_stall_s, "with --goodput: training stalled per checkpoint save")
      ->capture_default_str();
  cmd->add_option("--detect-s", fl->failures.detect_s, "with --goodput: time to detect a failure")->capture_default_str();
  cmd->add_option("--recover-s", fl->failures.recover_s,
                  "with --goodput: time to recover (kill, restart, load, first step)")
      ->capture_default_str();
  cmd->add_option("--calibrate", fl->calibrate, "fit latency and bandwidth from a `zaya bench collectives --csv` file");
  cmd->add_option("--compare", fl->compare, "with --calibrate: a CSV to predict (e.g. another rank count)");
  cmd->add_option("--fit-min-bytes", fl->fit_min, "with --calibrate: fit only sizes at least this large")->capture_default_str();
  commands.push_back({cmd, [fl, gpn, cmd] {
                        fl->hidden_fraction_given = cmd->get_option("--hidden-fraction")->count() > 0;
                        // The trainer-model flags mean nothing to the other tables: refuse them there.
                        for (const char* flag : {"--bucket-mb", "--grad-reduce", "--gather", "--prefetch-gather",
                                                 "--no-prefetch-gather", "--overlap-from", "--hidden-fraction"})
                          if (cmd->get_option(flag)->count() > 0 && fl->global_batch == 0)
                            throw Error("flag needs --global-batch", {.field = flag, .expected = "--model CONFIG --global-batch N"});
                        apply_preset(*fl, *cmd);
                        apply_run_config(*fl, *cmd);
                        return run_simulate(*fl, gpn->count() > 0);
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(simulate, zaya::app::add_simulate);
