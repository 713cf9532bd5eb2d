// RunConfig: the one config object of a training run (torchtitan-style), read from a TOML file
// plus `--set section.key=value` overrides. Each component reads its own section; unknown keys
// anywhere are an error naming the key and the file.
//
//   [model]  model::ModelConfig            [optim]  optim::OptimizerConfig
//   [data]   DataConfig (below)            [train]  TrainConfig (below)
//   [ckpt]   CkptConfig (below)          [recipe] optim::Recipe (optional; docs/train.md)
//   [parallel] ParallelConfig (below)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zaya/data/loader.h"
#include "zaya/model/config.h"
#include "zaya/optim/config.h"
#include "zaya/optim/schedule.h"

namespace zaya::train {

struct DataConfig {
  std::vector<data::DatasetSpec> train;  // data.train (prefixes) + data.weights
  std::string val;                       // validation prefix (optional)
  std::string tokenizer;                 // SentencePiece .model (for generate/eval text)
  uint64_t seed = 1234;                  // shuffle seed
};

struct TrainConfig {
  int64_t steps = 1000;               // optimizer steps
  int64_t micro_batch = 8;            // sequences per forward/backward
  int64_t seq_len = 256;              // tokens per sequence
  int64_t grad_accum = 1;             // micro-batches per optimizer step
  uint64_t seed = 1;                  // model init seed
  int64_t log_every = 10;             // plain log line / progress refresh every N steps
  int64_t eval_every = 100;           // validation loss every N steps (0: never)
  int64_t eval_samples = 64;          // validation sequences per evaluation
  std::string out_dir = "runs/demo";  // metrics.jsonl and checkpoints
  bool progress = true;               // progress bar when stderr is a terminal
  std::string init_from;              // start from these weights (zaya checkpoint or transformers dir)
  // Input precision of the weight GEMMs (experts, attention and router projections, the LM head):
  // "f32", or "bf16" (bf16 copies of their inputs, f32 accumulation; everything else stays f32:
  // docs/model.md, "bf16 GEMMs").
  std::string gemm_dtype = "f32";
  // The weights the model stores and computes with: "f32", or "bf16" (mixed precision as ZAYA1
  // trained: bf16 weights, rounded from fp32 master weights after every update, the masters
  // sharded under ZeRO-1 with the optimizer state; the parameter all-gather then moves bf16.
  // Needs gemm_dtype "bf16". train/master_weights.h, docs/train.md "Precision").
  std::string param_dtype = "f32";
  // Saved activations the backward reads: "f32", or "bf16" (ZayaModel::set_activation_dtype: the
  // large ones saved as bf16 copies only; the forward is unchanged). Needs gemm_dtype "bf16".
  std::string activation_dtype = "f32";
  // Activation recomputation (ZayaModel::set_recompute): keep only each layer's input and re-run
  // its forward in the backward, for about one layer's saved activations instead of all of them
  // at the cost of L − 1 layer forwards per step; bitwise the same training.
  bool recompute = false;
  // Stop the run (an error) when this many optimizer updates in a row were skipped for a
  // non-finite gradient norm: the weights stop changing, so the run would only burn time. While
  // any update of the current streak was skipped, no checkpoint is saved (docs/train.md).
  int64_t max_skipped_steps = 10;
  // Per-rank heartbeat files for a supervisor (docs/aegis.md). Off only to measure what they cost:
  // without them `zaya supervise` cannot see hangs, spikes or stragglers.
  bool heartbeat = true;
  // Fault injection specs, as --inject takes them (train/fault_inject.h, docs/aegis.md).
  std::vector<std::string> inject;
  // The fixed peak MFU divides by (train/mfu_peak.h): "auto" (the GPU's datasheet peak, or the
  // CPU's cores x clock x FLOPs/cycle), "cpu", or a datasheet name ("h100", ...); a positive
  // mfu_peak_flops (FLOP/s per rank) states the figure instead.
  std::string mfu_peak = "auto";
  double mfu_peak_flops = 0;
};

struct CkptConfig {
  int64_t every = 0;       // save every N steps (0: only at the end and on SIGINT/SIGTERM)
  int64_t keep_last = 3;   // keep the newest K checkpoints ...
  int64_t keep_every = 0;  // ... and every N-th step permanently (0: none)
  bool save_final = true;  // save after the last step
  // How a save snapshots the state (docs/results/checkpoint.md): "deferred" (the default: the copy
  // into staging memory runs in the background during the next forward/backward, and the optimizer
  // step waits for it), "copy" (the copy stalls training), or "fork" (copy-on-write: a tiny stall,
  // but the next step pays a page fault per 4 KiB it writes, more in total on the CPU).
  std::string snapshot = "deferred";
};

// Where and over how many ranks the run trains (docs/train.md, "Devices and ranks"). The world
// (the launcher's ranks) must equal dp × cp.
struct ParallelConfig {
  std::string device = "cpu";  // "cpu" or "cuda" (one GPU per rank)
  int64_t dp = 0;              // data-parallel ranks; 0: the world size / cp
  int64_t cp = 1;              // context-parallel ranks per data-parallel replica
  // With cp > 1: attention's K/V exchange overlapped with the chunks' own-keys attention and merged
  // by log-sum-exp (true), or gathered before one pass over all keys (false); the two agree within
  // fp32 rounding (docs/context-parallel.md, "Overlap").
  bool cp_overlap = true;
  // Gradient bucket size for the data-parallel reductions, in MiB: buckets are reduced as soon as
  // backward fills them, while it goes on.
  double bucket_mb = 32;
  // How gradients are summed over micro-batches and ranks (train/grad_sync.h): "f32", "bf16"
  // (half the bytes on the wire) or "f64" (order-independent: N ranks train bitwise like one).
  std::string grad_reduce = "f32";
  // The parameter all-gather after each update runs under the next forward, which waits for each
  // bucket only when it first reads it (train/grad_sync.h). The values are the same either way.
  bool overlap_param_gather = true;
  // A collective that has not completed after this long names the ranks that never arrived and
  // stops every rank.
  double timeout_s = 300;
};

struct RunConfig {
  model::ModelConfig model;
  optim::OptimizerConfig optim;
  DataConfig data;
  TrainConfig train;
  CkptConfig ckpt;
  ParallelConfig parallel;
  // The multi-phase recipe and batch ramp; no phases: none (a fixed micro_batch x seq_len x
  // grad_accum step). With a recipe, each phase's rope_theta is filled in (0 -> model.rope_theta),
  // train.seq_len and train.grad_accum describe phase 0's first step, and train.steps and
  // optim.total_steps default to the steps the recipe takes (Recipe::num_steps; train.steps may be
  // smaller to stop early, the schedule still spans the recipe).
  optim::Recipe recipe;
  std::string source;                  // the config file
  std::string text;                    // its TOML text (stored in checkpoints)
  std::vector<std::string> overrides;  // the --set arguments
  // Every key the sections read, with its effective value in TOML notation (ConfigReader::values),
  // derived values (the run length, phase 0's shape, each phase's rope_theta) filled in: what a
  // resumed run compares with its checkpoint's config (config_change.h).
  std::map<std::string, std::string> values;

  bool has_recipe() const { return !recipe.phases.empty(); }
  // Tokens of one step without a recipe (with one, see Recipe::step_at).
  int64_t tokens_per_step() const { return train.micro_batch * train.seq_len * train.grad_accum; }
};

// Reads, validates and cross-checks every section; throws zaya::Error naming file and key.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides);
RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides);

}  // namespace zaya::train
