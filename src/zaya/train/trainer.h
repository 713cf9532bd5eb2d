// The training loop (`zaya train`): each step is a TrainStep (data -> forward/backward with
// gradient accumulation -> gradient sync -> clip + Muon/AdamW -> expert balancing); around it the
// trainer keeps the recipe's phases, metrics, evaluation and checkpoints, with exact resume.
//
// One object owns the run's components (torchtitan-style: one config, no globals); run() executes
// it. Rank and world size come from the communicator; until data parallelism lands the world must
// be one rank (a larger one stops at start with a clear error).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zaya/ckpt/run_lock.h"
#include "zaya/ckpt/writer.h"
#include "zaya/core/peak_flops.h"
#include "zaya/data/loader.h"
#include "zaya/dist/communicator.h"
#include "zaya/train/context_group.h"
#include "zaya/dist/mesh.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/shard_plan.h"
#include "zaya/train/fault_inject.h"
#include "zaya/train/grad_sync.h"
#include "zaya/train/heartbeat.h"
#include "zaya/train/master_weights.h"
#include "zaya/optim/optimizer.h"
#include "zaya/train/progress.h"
#include "zaya/train/run_config.h"
#include "zaya/train/skip_windows.h"
#include "zaya/train/train_step.h"

namespace zaya::train {

using TimePoint = std::chrono::steady_clock::time_point;

struct TrainOptions {
  std::string resume;  // "" (fresh), "latest" (newest under out_dir), a run dir or a checkpoint dir
  // With an older checkpoint in `resume`: move out_dir's newer checkpoints aside into
  // out_dir/rewound-<time>/ and continue from it (without: refused at start). train/resume.h.
  bool rewind = false;
  bool quiet = false;  // no model summary
  // Set by the SIGINT/SIGTERM handler (or a test): save a checkpoint and return.
  std::atomic<bool>* stop = nullptr;
  int64_t stop_after_steps = -1;        // test hook: stop (with a checkpoint) after this many steps
  int test_pause_before_commit_ms = 0;  // test hook: slow every checkpoint commit down
  // Resume even when the run config changes settings that alter what the run computes (the data,
  // batch, schedule, ...): the run then leaves the checkpoint's trajectory (docs/train.md).
  bool allow_config_change = false;
  // Fault injection specs (train/fault_inject.h), added to the run config's train.inject.
  std::vector<std::string> inject;
  // Global sample windows "A:B" to skip (train/skip_windows.h), added to the checkpoint's.
  std::vector<std::string> skip_samples;
};

// The failures `zaya train` reports with their own exit codes (docs/aegis.md, "Trainer side"), so
// a supervisor can tell them apart from bad input (2) without parsing messages.
// train.max_skipped_steps updates in a row skipped for a non-finite loss or gradient norm: exit 4.
class NonFiniteStop : public Error {
 public:
  using Error::Error;
};
// A checkpoint save failed (in the background or at the end of the run): exit 5.
class CheckpointSaveFailed : public Error {
 public:
  using Error::Error;
};

struct TrainResult {
  int64_t first_step = 0;            // step the run started from (0, or the resumed checkpoint's)
  int64_t last_step = 0;             // optimizer steps completed
  std::vector<double> losses;        // training loss of each step this run took
  std::vector<int> phases;           // recipe phase of each step (0 without a recipe)
  std::vector<int64_t> batch_sizes;  // sequences in each step's batch (micro-batches x micro_batch)
  std::optional<double> final_val_loss;
  bool interrupted = false;
  bool nothing_to_do = false;  // resumed at or past train.steps: no step was taken
  std::string last_checkpoint;  // directory of the newest checkpoint written
};

class Trainer {
 public:
  explicit Trainer(RunConfig config, TrainOptions options = {});
  ~Trainer();
  // Writes the final heartbeat ("done", "stopping", or "failed" with the error, rethrown).
  TrainResult run();

  model::ZayaModel& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  void set_up();  // the constructor after the run lock (a failure writes the "failed" heartbeat)
  TrainResult run_steps();
  void beat(const char* phase, const std::string* error = nullptr) {
    if (heartbeat_) heartbeat_->beat(phase, step_, error);
  }
  // The last beats on disk: before the process ends (a result, an error, an injected fault).
  void flush_beats() {
    if (heartbeat_) heartbeat_->flush();
  }
  // Before a step: moves the loader past the skip windows the step's samples would meet.
  void skip_windows(int64_t micro_batches);
  // Injected faults at the end of step step_ (kill, hang, exit).
  void inject_step_end();
  // The fence before the update: the deferred snapshot's copy, then the injected nan and slow faults.
  double before_update(TimePoint step_start);
  void print_summary() const;
  void lock_run_dir();
  bool rank0() const { return comm_->rank() == 0; }
  dist::Communicator& dp() { return mesh_->dp(); }
  // ZeRO-1 shards the optimizer over every rank of the world (dp × cp), and the gradients are
  // reduced over it: the cp ranks' gradients are parts of one sequence's, the dp ranks' of other
  // samples' (docs/context-parallel.md, "Gradients and ZeRO-1").
  dist::Communicator& zero() { return *comm_; }
  // The same for the gradients' and parameters' buffers: NCCL's on GPUs, else zero().
  dist::Communicator& zero_device() { return device_comm_ ? *device_comm_ : zero(); }
  // The same string on every rank: rank 0's.
  std::string from_rank0(const std::string& s);
  // Whether any rank asks to stop (a signal reaches the ranks at different steps).
  bool any_rank(bool flag);
  // `verified`: every checksum of the checkpoint was just checked, so loading skips them.
  void restore(const std::string& dir, bool verified);
  TrainResult finished_run() const;
  std::string save(bool wait);
  std::vector<ckpt::SaveItem> save_items();
  nlohmann::json state_json() const;
  std::optional<double> evaluate_now(const char* when, Progress& progress, MetricsSink& metrics);
  void announce_phase(int64_t batch, Progress& progress, MetricsSink& metrics);
  void log_measured_memory() const;  // the peak of the first step, by device
  int64_t prepare_step(Progress& progress, MetricsSink& metrics);
  // Recipe runs: builds phase p's train (and validation) loader, reshapes the model to the phase's
  // sequence length and switches its RoPE θ. `offsets`: the datasets' starting counts (from a
  // checkpoint); null: continue from the current phase's loader (phase_ < 0: start at 0).
  void enter_phase(int p, const std::vector<int64_t>* offsets);
  std::vector<data::DatasetSpec> phase_specs(int p) const;
  // Counts skipped updates in a row and stops the run (a zaya::Error) at train.max_skipped_steps.
  void track_skipped_updates(const StepResult& r);
  // False (with a warning naming `what`) while the current streak of skipped updates lasts: such a
  // state is never saved over the last good checkpoint.
  bool may_save(const char* what) const;
  // At a step boundary: a background checkpoint save that failed stops training now (a zaya::Error
  // naming the save and the step), rather than at the next save.
  void check_background_save();
  // At resume: logs how the run config differs from the one the checkpoint in `dir` was written
  // with, and refuses changes that are not config_change_is_safe unless allow_config_change.
  void check_config_change(const nlohmann::json& state, const std::string& dir) const;

  RunConfig cfg_;
  TrainOptions opts_;
  std::unique_ptr<dist::Communicator> comm_;  // the world
  std::unique_ptr<dist::Mesh> mesh_;          // dp × cp over comm_
  std::unique_ptr<dist::Communicator> device_comm_;  // NCCL over the same ranks (GPU runs of several ranks)
  std::unique_ptr<CommContextGroup> cp_group_;  // the model's exchanges over the cp axis (cp > 1)
  optim::ShardPlan plan_;                     // the ZeRO-1 ranges of the dp ranks
  std::unique_ptr<GradientSync> sync_;        // dp > 1 or parallel.grad_reduce = "f64"
  // Held from before the run directory is touched until after the last write into it (declared
  // before writer_, so destroyed after it).
  std::unique_ptr<ckpt::RunLock> run_lock_;
  std::unique_ptr<model::ZayaModel> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<MasterWeights> master_;     // train.param_dtype = "bf16": this rank's fp32 master weights
  std::unique_ptr<data::DataLoader> train_data_, val_data_;
  std::unique_ptr<ckpt::CheckpointWriter> writer_;
  int64_t step_ = 0;    // optimizer steps done
  int64_t tokens_ = 0;  // tokens consumed
  int phase_ = -1;      // recipe phase the model and loaders are set up for (-1: none)
  int64_t batch_ = 0;   // sequences in the last step's batch (recipe runs)
  int64_t skipped_in_a_row_ = 0;     // updates skipped (non-finite gradient norm) since the last real one
  int64_t last_real_update_ = 0;     // step of the last update that was not skipped
  std::unique_ptr<Heartbeat> heartbeat_;  // every rank's, from the run lock on
  FaultInjector faults_;
  std::vector<SampleWindow> skip_windows_;  // merged: the checkpoint's and the options'
  int64_t committed_seen_ = -1;             // rank 0: the last save whose commit was beaten
  std::string tokenizer_copy_;              // the run directory's copy of data.tokenizer (run_tokenizer.h)
};

// Installs SIGINT/SIGTERM handlers that set `flag`: the first two signals ask for a clean stop
// with a checkpoint (`timeout` and Slurm signal the whole process group, so one stop request often
// arrives twice); a third one takes the default action and ends the run without saving.
void install_stop_handlers(std::atomic<bool>* flag);

}  // namespace zaya::train
