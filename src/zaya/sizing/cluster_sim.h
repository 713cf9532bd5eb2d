// `zaya simulate`: an alpha-beta model of collectives on a cluster (nodes × GPUs, intra-node
// fabric, NICs per node, rails-only or fat-tree) and of ZeRO-1 data-parallel scaling.
//
// Cost model (docs/simulate.md derives each formula). A message of b bytes over one hop costs
// α_hop + b / B_hop. Algorithms move in synchronous steps in which every rank sends at once; a
// step lasts as long as its slowest hop. Hops:
//   intra   GPU to GPU in a node:  α = intra latency,  B = intra bandwidth per GPU (one direction)
//   inter   node to node:          α = NIC latency + switch hops × switch latency,
//                                  B = the NIC bandwidth the step's senders share
// A flat ring runs as many channels as there are NICs, each entering and leaving a node on one
// rail (as NCCL does), so its inter-node hop gets the node's whole NIC bandwidth and rails-only
// costs it nothing. Traffic between different rails (all_to_all) must cross the intra-node
// fabric first on rails-only; on a fat-tree it goes straight to the spine (3 switch hops instead
// of 1). Contention beyond that (congestion, adaptive routing, SHARP) is not modelled.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zaya/model/config.h"
#include "zaya/sizing/hardware.h"

namespace zaya::sizing {

enum class Topology { rails_only, fat_tree };
enum class SimColl { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };
enum class SimAlgo { ring, tree, hierarchical };
constexpr SimColl kSimColls[] = {SimColl::all_reduce, SimColl::reduce_scatter, SimColl::all_gather, SimColl::broadcast,
                                 SimColl::all_to_all};
constexpr SimAlgo kSimAlgos[] = {SimAlgo::ring, SimAlgo::tree, SimAlgo::hierarchical};
const char* sim_coll_name(SimColl c);
const char* sim_algo_name(SimAlgo a);
SimColl parse_sim_coll(const std::string& name, const std::string& flag);  // throws naming the flag
Topology parse_topology(const std::string& name, const std::string& flag);
// nccl-tests' busbw factor: all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n;
// broadcast 1.
double sim_bus_factor(SimColl c, int nranks);

struct ClusterSpec {
  int nodes = 1;
  int gpus_per_node = 8;
  Topology topology = Topology::rails_only;
  int nics_per_node = 8;
  double nic_gbps = 400;            // Gbit/s per NIC, one direction
  double intra_gbs = 450;           // GB/s per GPU to its node peers, one direction
  double intra_latency_us = 1.0;    // per intra-node hop
  double nic_latency_us = 2.0;      // NIC to NIC through one switch (the inter-node --latency-us)
  double switch_latency_us = 0.5;   // each extra switch hop (fat-tree crosses leaf-spine-leaf)
  int ranks() const { return nodes * gpus_per_node; }
  void validate() const;            // throws zaya::Error naming the flag
};

// One hop type's parameters in SI units.
struct Hop {
  double alpha_s = 0;
  double bytes_per_s = 0;
  double cost(double bytes) const { return alpha_s + bytes / bytes_per_s; }
};
Hop intra_hop(const ClusterSpec& c);
// The inter-node hop of one step in which `senders_per_node` GPUs of each node send at once over
// the node's NICs; cross_rail: the data changes rail (rails-only then also crosses the intra
// fabric).
Hop inter_hop(const ClusterSpec& c, int senders_per_node, bool cross_rail);

// Predicted time (seconds) of one collective of `bytes` (the nccl-tests size column: the whole
// array for reduce_scatter, all_gather, all_to_all); nullopt where the algorithm does not apply
// (tree for reduce_scatter/all_gather/all_to_all).
std::optional<double> collective_time(const ClusterSpec& c, SimColl op, SimAlgo algo, double bytes);

struct SimRow {
  double bytes = 0;
  std::optional<double> time_s[3];  // ring, tree, hierarchical
  SimAlgo best = SimAlgo::ring;
  double best_time_s() const { return *time_s[static_cast<int>(best)]; }
};
std::vector<SimRow> simulate_sweep(const ClusterSpec& c, SimColl op, const std::vector<double>& sizes);
// nccl-tests-like table: size, count (float), then time (us) and busbw (GB/s) per algorithm, best.
std::string format_sweep(const ClusterSpec& c, SimColl op, const std::vector<SimRow>& rows);

// ---- calibration from `zaya bench collectives --csv` ----

struct CollectiveSample {
  std::string op;
  int ranks = 0;
  double bytes = 0;
  double time_s = 0;  // out-of-place time
};
// Reads the CSV columns op, ranks, size_bytes, oop_time_us (others ignored); throws naming the
// file, line and column.
std::vector<CollectiveSample> read_collectives_csv(const std::string& path);

// Least squares t = alpha + bytes * beta over the samples of one op and rank count, weighted by
// 1/t² (relative error).
struct LinearFit {
  double alpha_s = 0, beta_s_per_byte = 0;
  int points = 0;
};
LinearFit fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& time_s);

// A fit of one (op, ranks), turned into the per-hop α and B of the ring formula of that op on one
// node (all_reduce: 2(n-1) steps of S/n; reduce_scatter, all_gather, all_to_all: n-1 steps of
// S/n; broadcast: a pipelined chain, (n-1) α + S / B).
struct Calibration {
  std::string op;
  int ranks = 0;
  LinearFit fit;
  Hop hop;
};
std::vector<Calibration> calibrate(const std::vector<CollectiveSample>& samples, double min_bytes);
// The one-node ring prediction with a calibrated hop, for `ranks` ranks (may differ from the
// calibration's rank count: that is the extrapolation docs/results/cluster-cpu.md checks).
double calibrated_time(const Calibration& cal, int ranks, double bytes);

// ---- ZeRO-1 data-parallel scaling ----

struct ScalingRow {
  int gpus = 0;
  double compute_s = 0;
  double reduce_scatter_s = 0, all_gather_s = 0;  // best algorithm each
  double step_no_overlap_s = 0, step_overlap_s = 0;
  double efficiency_no_overlap = 0, efficiency_overlap = 0;  // compute / step
};
// Per-GPU micro-batch fixed (weak scaling): compute from the sizing model on `hw` (GEMM table
// when present); ZeRO-1 communication: reduce-scatter of fp32 gradients (4 B/param) and
// all-gather of bf16 weights (2 B/param) over every GPU. Overlap: the reduce-scatter hides under
// backward (2/3 of compute), the all-gather under the next forward (1/3).
ScalingRow zero1_step(const ClusterSpec& cluster, const model::ModelConfig& m, int64_t tokens_per_gpu, int64_t seq,
                      const HardwareProfile& hw);

}  // namespace zaya::sizing
