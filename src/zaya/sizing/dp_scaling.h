// Data-parallel scaling as the trainer runs it (docs/data-parallel.md, docs/simulate.md "The
// trainer's data-parallel step"): a fixed global batch split over N GPUs by gradient accumulation,
// gradient buckets (dist::plan_buckets on the model's report order, the trainer's own plan)
// reduce-scattered during the LAST micro-batch's backward only, one after another on the network;
// then the ZeRO-1 optimizer step of the busiest rank (optim::plan_shards) and the parameter
// all-gather, which the trainer runs after the step (exposed) unless prefetching is assumed.
//
// Collectives are priced with the cluster model of cluster_sim.h. NCCL has no variable-count
// collectives: the trainer issues a bucket's reduce_scatter_v as one ncclReduce per rank whose
// block is not empty (grouped) and the all-gather as one ncclBroadcast per rank. NCCL runs each as
// a pipelined chain around its ring; run together they share the ring's links, so the group costs
// about one pipelined chain carrying all of the bucket's bytes, with one latency per hop of the
// chain per bucket (grouped_chain_time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/model/config.h"
#include "zaya/sizing/cluster_sim.h"
#include "zaya/sizing/hardware.h"

namespace zaya::sizing {

// ---- cluster presets ----

struct ClusterPreset {
  std::string name;         // "mi300x-pollara", "h100-ib"
  ClusterSpec cluster;      // 128 nodes of 8 GPUs (ZAYA1's cluster size)
  std::string hw;           // the compute profile that goes with it
  std::string description;  // one line for the printed header
};
std::vector<std::string> cluster_preset_names();
ClusterPreset cluster_preset(const std::string& name, const std::string& flag);  // throws naming the flag

// ---- compute of one micro-batch, split the way backward reports gradients ----

struct MicroBatchCompute {
  double forward_s = 0;
  double backward_s = 0;       // head + layers (+ nothing for the embedding lookup's backward)
  double head_backward_s = 0;  // the tied LM head's backward: runs first, before any report
  double layer_backward_s = 0; // one decoder layer's backward (layers are identical)
  double total_s() const { return forward_s + backward_s; }
};
// GEMM by GEMM from model_gemms at gemm_rate (as predicted_compute_seconds, whose total it
// equals), attention's FLOPs split 1/3 forward, 2/3 backward.
MicroBatchCompute micro_batch_compute(const model::ModelConfig& m, int64_t tokens, int64_t seq, const HardwareProfile& hw);

// When each range of model::gradient_report_order(specs) becomes final, in seconds from the start
// of backward: the final norm after the head's backward, layer L−1 .. 0 one layer's backward
// apart, the embedding (and the tensors before layer 0) at the end. Expects the report order's
// shape: 1 + layers + 1 entries.
std::vector<double> report_ready_times(const MicroBatchCompute& c, size_t reports);

// ---- the bucket timeline of the last micro-batch's backward ----

struct BucketTask {
  double ready_s = 0;  // when backward has produced the bucket (from the start of backward)
  double comm_s = 0;   // its collective's time on the network
};
struct OverlapResult {
  double backward_end_s = 0;
  double comm_end_s = 0;  // when the last collective ends (never before backward ends)
  double comm_s = 0;      // the sum of the collectives' times
  double exposed_s = 0;   // comm_end − backward_end: the wait after backward
  double hidden_s = 0;    // comm − exposed: network time spent while backward ran
};
// The network runs one collective at a time, in bucket order (one stream, one queue); a bucket's
// collective starts when it is ready and the previous one has ended. `hidden_cap` in [0, 1] caps
// the fraction of each bucket's communication that may overlap backward: the part cap·comm runs
// in that queue, the rest (1 − cap)·comm only after backward ends (a progress engine that advances
// collectives only some of the time: MPI on CPUs). cap = 1 is the plain queue (NCCL progresses on
// its own). Buckets must be in nondecreasing ready order, each ready no later than backward ends.
OverlapResult simulate_bucket_overlap(const std::vector<BucketTask>& buckets, double backward_end_s, double hidden_cap);

// ---- the trainer's variable-count collectives ----

// A group of pipelined chains around the ring (one ncclReduce or ncclBroadcast per rank with a
// non-empty block) carrying `bytes` in all. Chunks stream back to back, so each hop of the chain
// adds its latency once and the bytes cross the slowest hop once. The chain visits the nodes in
// turn: G−1 intra-node hops per node, one inter-node hop between nodes whose channels stripe over
// all of the node's NICs (cluster_sim's flat ring): latency N(G−1)·α_intra + (N−1)·α_inter, plus
// bytes / min(B_intra, B_inter).
double grouped_chain_time(const ClusterSpec& c, double bytes);

// ---- the optimizer step ----

struct OptimizerStepCost {
  double memory_s = 0;        // the busiest rank's state traffic at the profile's memory bandwidth
  double newton_schulz_s = 0; // ... its Newton–Schulz FLOPs at the profile's achievable rate
  double small_collectives_s = 0;  // the global-norm and expert-count all-reduces (latency bound)
  double total_s() const { return memory_s + newton_schulz_s + small_collectives_s; }
  double ns_imbalance = 0;    // the shard plan's Newton–Schulz max/mean
  int busiest_rank = 0;
};
// Bytes per element of an update: AdamW reads p, g, m, v and writes p, m, v (28 B) plus the
// clipping norm's read of g (4 B); Muon reads g, m, writes m, reads its update and p, writes p
// (24 B) plus the norm's read (4 B). Newton–Schulz: ns_steps iterations of the plan's per-iteration
// FLOPs (optim::newton_schulz_flops) per matrix the rank owns.
constexpr double kAdamWBytesPerElement = 32, kMuonBytesPerElement = 28;
OptimizerStepCost optimizer_step_cost(const ClusterSpec& cluster, const model::ModelConfig& m, const HardwareProfile& hw);

// ---- the data-parallel step at N GPUs ----

enum class WireDType { bf16, f32, f64 };
WireDType parse_wire_dtype(const std::string& name, const std::string& flag, bool allow_f64);
const char* wire_dtype_name(WireDType d);
double wire_bytes(WireDType d);

struct DpOptions {
  int64_t global_batch = 4096;  // sequences per optimizer step, fixed across N
  int64_t micro_batch = 1;      // sequences per micro-batch per GPU
  int64_t seq = 4096;
  double bucket_mb = 32;        // MiB of f32 per bucket (the trainer's parallel.bucket_mb)
  WireDType grad_wire = WireDType::f32;    // parallel.grad_reduce
  WireDType gather_wire = WireDType::f32;  // the trainer all-gathers f32 parameters
  bool prefetch_gather = false;  // all-gather overlapped with the next step's first forward
  double hidden_cap = 1.0;       // see simulate_bucket_overlap
  void validate() const;         // throws naming the flag
};

struct DpStepRow {
  int gpus = 0, nodes = 0;
  int64_t grad_accum = 0;     // micro-batches per GPU per step
  bool batch_grows = false;   // global/(mbs·N) < 1: one micro-batch per GPU, the batch is larger
  bool batch_rounded = false; // not a multiple of mbs·N: rounded up to whole micro-batches
  int64_t tokens_per_gpu = 0; // per step
  int buckets = 0;
  double compute_s = 0;       // grad_accum micro-batches, forward + backward
  double last_backward_s = 0; // the backward the buckets can hide behind
  OverlapResult rs;           // the bucket timeline
  double gather_s = 0, gather_exposed_s = 0;
  OptimizerStepCost optimizer;
  double step_s = 0;          // compute + exposed RS + optimizer + exposed all-gather
  double tokens_per_s_per_gpu() const { return static_cast<double>(tokens_per_gpu) / step_s; }
  double compute_fraction() const { return compute_s / step_s; }  // efficiency against compute alone
};
DpStepRow dp_step(const ClusterSpec& cluster, const model::ModelConfig& m, const DpOptions& o, const HardwareProfile& hw);

// The table at each GPU count (cluster.gpus_per_node per node, nodes = gpus / gpus_per_node);
// efficiency = per-GPU throughput / per-GPU throughput of the first (smallest) row.
std::vector<DpStepRow> dp_scaling(const ClusterSpec& cluster, const model::ModelConfig& m, const DpOptions& o,
                                  const HardwareProfile& hw, const std::vector<int>& gpu_counts);
std::string format_dp_scaling(const std::vector<DpStepRow>& rows);

// The median of `data_parallel.hidden_fraction` over the records of a `zaya train` metrics.jsonl
// that carry one; throws naming the file (and line) when it cannot be read or holds none.
double median_hidden_fraction(const std::string& metrics_path);

}  // namespace zaya::sizing
