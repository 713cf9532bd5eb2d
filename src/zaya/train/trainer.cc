#include "zaya/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/rank_save.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/build_info.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/log.h"
#include "zaya/core/threads.h"
#include "zaya/data/token_range.h"
#include "zaya/data/tokenizer.h"
#include "zaya/model/params.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/optim/schedule.h"
#include "zaya/train/batch.h"
#include "zaya/train/context_group.h"
#include "zaya/train/config_change.h"
#include "zaya/train/mfu_peak.h"
#include "zaya/train/model_io.h"
#include "zaya/train/resume.h"
#include "zaya/train/run_tokenizer.h"
#include "zaya/train/step_metrics.h"
#include "zaya/train/train_step.h"

namespace zaya::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Stop signals. `timeout` signals the trainer and then its whole process group, Slurm signals
// every process of the step, and a user may press Ctrl-C twice: the first two signals (whatever
// mix of SIGINT and SIGTERM) ask for the same clean stop with a checkpoint, and only a third one
// takes the default action and ends the run without saving. Async-signal-safe: lock-free atomics
// and write(2).
std::atomic<bool>* g_stop_flag = nullptr;
std::atomic<int> g_stop_signals{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

void say(const char* msg) { [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg, std::strlen(msg)); }

extern "C" void on_stop_signal(int sig) {
  const int n = g_stop_signals.fetch_add(1) + 1;
  if (n >= 3) {
    say("\nzaya train: third stop signal: ending without saving a checkpoint\n");
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  if (g_stop_flag) g_stop_flag->store(true);
  say(n == 1 ? "\nzaya train: stop signal: saving a checkpoint after this step, then exiting\n"
             : "\nzaya train: stop signal again: still saving the checkpoint (a third signal ends without it)\n");
}

// The world this process belongs to, against [parallel], before anything is loaded.
void check_parallel(RunConfig& c) {
  ParallelConfig& p = c.parallel;
  const int world = dist::launcher_world_size();
  if (p.dp == 0) p.dp = std::max<int64_t>(1, world / p.cp);
  if (p.dp * p.cp != world)
    throw Error(str("parallel.dp x parallel.cp = ", p.dp, " x ", p.cp, " = ", p.dp * p.cp,
                    " ranks, but this process was launched in a world of ", world,
                    world == 1 ? " (launch the ranks with mpirun -np N or srun)" : ""),
                {.file = c.source, .field = "parallel.dp"});
  // Every sequence length the run will train at must split into 2·cp zigzag chunks (the error
  // names parallel.cp and the length).
  if (p.cp > 1) {
    model::zigzag_chunk_len(c.train.seq_len, p.cp);
    for (const optim::Phase& ph : c.recipe.phases) model::zigzag_chunk_len(ph.seq_len, p.cp);
  }
  if (p.device == "cuda") {
    if (cuda::device_count() == 0)
      throw Error(str("parallel.device = \"cuda\", but this process sees no GPU (", cuda::no_device_reason(),
                      "); use \"cpu\""),
                  {.file = c.source, .field = "parallel.device", .found = "\"cuda\""});
  }
  // Every recipe phase's global batch must split into whole micro-batches on every rank.
  for (const optim::Phase& ph : c.recipe.phases)
    if (ph.batch_size % (c.train.micro_batch * p.dp) != 0)
      throw Error(str("recipe phase '", ph.name, "' has a batch of ", ph.batch_size,
                      " sequences, which does not split into micro-batches of ", c.train.micro_batch, " over ", p.dp,
                      " data-parallel ranks (it must be a multiple of ", c.train.micro_batch * p.dp, ")"),
                  {.file = c.source, .field = "recipe"});
}

}  // namespace

void install_stop_handlers(std::atomic<bool>* flag) {
  g_stop_flag = flag;
  g_stop_signals.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal during a checkpoint write does not fail the write with EINTR
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

Trainer::Trainer(RunConfig config, TrainOptions options)
    : cfg_(std::move(config)), opts_(std::move(options)) {
  check_parallel(cfg_);
  const dist::Options comm_options{.timeout_s = cfg_.parallel.timeout_s};
  comm_ = dist::launcher_world_size() > 1 ? dist::make_mpi_communicator(comm_options)
                                          : dist::make_local_communicator(comm_options);
  set_log_rank(comm_->rank(), comm_->size());
  // One rank speaks for the run; the others report only warnings and errors.
  if (!rank0() && log_level() < LogLevel::warn) set_log_level(LogLevel::warn);
  mesh_ = std::make_unique<dist::Mesh>(*comm_, static_cast<int>(cfg_.parallel.dp), static_cast<int>(cfg_.parallel.cp));
  if (cfg_.parallel.device == "cuda" && comm_->size() > 1 && !cuda::emulated()) {
    // The gradient buckets and the parameter all-gather move device buffers: NCCL, bootstrapped
    // over MPI, one GPU per rank. The host's collectives (losses, expert counts, the norm, the
    // checkpoint's gather) stay on MPI. The emulated device's buffers are host memory, which the
    // MPI world carries itself.
    device_comm_ = dist::make_nccl_communicator(comm_options);
  }
  // Bad fault specs and skip windows are input errors, raised before the run directory is touched.
  std::vector<std::string> inject = cfg_.train.inject;
  inject.insert(inject.end(), opts_.inject.begin(), opts_.inject.end());
  opts_.inject = inject;
  for (const std::string& spec : opts_.inject) parse_fault_spec(spec);
  const int attempt = inject_attempt_from_env();
  for (const std::string& w : opts_.skip_samples)
    skip_windows_ = merge_windows(skip_windows_, {parse_sample_window(w, "--skip-samples")});
  lock_run_dir();
  // From here on this rank reports its progress; a start-up that fails says so in its heartbeat.
  if (cfg_.train.heartbeat) heartbeat_ = std::make_unique<Heartbeat>(cfg_.train.out_dir, comm_->rank(), comm_->size());
  beat("start");
  try {
    set_up();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    beat("failed", &message);
    flush_beats();
    throw;
  }
  faults_ = FaultInjector(opts_.inject, comm_->rank(), step_, attempt);
}

void Trainer::set_up() {
  const auto& t = cfg_.train;
  train_data_ = std::make_unique<data::DataLoader>(cfg_.data.train, t.seq_len, cfg_.data.seed);
  for (int d = 0; d < train_data_->num_datasets(); ++d)
    ZAYA_CHECK(train_data_->samples_per_epoch(d) > 0, cfg_.data.train[static_cast<size_t>(d)].prefix,
               ": too few tokens for one sample of ", t.seq_len + 1, " tokens");
  if (!cfg_.data.val.empty())
    val_data_ = std::make_unique<data::DataLoader>(std::vector<data::DatasetSpec>{{cfg_.data.val, 1.0}},
                                                   t.seq_len, cfg_.data.seed + 1);
  // Every token id of every dataset inside the vocabulary, checked now on the loaders' open datasets
  // (one scan of each .bin, cached beside large ones) rather than when a batch reaches a bad one
  // hours into the run.
  for (int d = 0; d < train_data_->num_datasets(); ++d)
    data::check_token_range(train_data_->dataset(d), cfg_.model.vocab_size);
  if (val_data_) data::check_token_range(val_data_->dataset(0), cfg_.model.vocab_size);
  // Every phase's loaders are built once here so that a dataset too short for a later phase's
  // sequence length fails now, not at a transition hours into the run (the loader checks it).
  for (size_t p = 0; p < cfg_.recipe.phases.size(); ++p) {
    const int64_t seq = cfg_.recipe.phases[p].seq_len;
    data::DataLoader probe(phase_specs(static_cast<int>(p)), seq, cfg_.data.seed);
    if (!cfg_.data.val.empty()) data::DataLoader val_probe({{cfg_.data.val, 1.0}}, seq, cfg_.data.seed + 1);
  }
  if (!cfg_.data.tokenizer.empty()) {
    // Token ids are checked again by the embedding; this catches the mismatch before training.
    int64_t vocab = data::Tokenizer::load(cfg_.data.tokenizer).vocab_size();
    ZAYA_CHECK(vocab <= cfg_.model.vocab_size, cfg_.source, ": data.tokenizer has ", vocab,
               " tokens but model.vocab_size is ", cfg_.model.vocab_size);
    // The run's own copy, which its checkpoints name: they outlive the data directory.
    tokenizer_copy_ = rank0() ? keep_run_tokenizer(t.out_dir, cfg_.data.tokenizer)
                              : run_tokenizer_name(cfg_.data.tokenizer);
  }

  model_ = std::make_unique<model::ZayaModel>(cfg_.model, t.micro_batch, t.seq_len,
                                              cfg_.parallel.device == "cuda" ? Device::cuda : Device::cpu);
  model_->init(t.seed);
  if (mesh_->cp_size() > 1) {
    cp_group_ = make_context_group(*mesh_, device_comm_.get());  // on GPUs, NCCL between device buffers
    model_->set_context_parallel(cp_group_.get(), cfg_.parallel.cp_overlap ? model::CpSchedule::overlapped
                                                                           : model::CpSchedule::blocking);
  }
  if (t.gemm_dtype == "bf16") {
    model_->set_gemm_dtype(DType::bf16);
    if (!ops::cpu::gemm_bf16_native())
      log_warn(
          "train.gemm_dtype = \"bf16\": this CPU has no native bf16 matmul (avx512_bf16 or AMX), so "
          "the bf16 GEMMs run in f32 on widened copies, slower than train.gemm_dtype = \"f32\"");
  }
  if (t.activation_dtype == "bf16") model_->set_activation_dtype(DType::bf16);
  model_->set_recompute(t.recompute);
  const optim::ParamTable table = optim::ParamTable::of(*model_);
  plan_ = optim::plan_shards(table, cfg_.optim, zero().size());
  if (t.param_dtype == "bf16") {  // the optimizer updates this rank's fp32 master weights
    master_ = std::make_unique<MasterWeights>(*model_, plan_.range(zero().rank()));
    optimizer_ = std::make_unique<optim::Optimizer>(cfg_.optim, master_->table(), plan_.range(zero().rank()));
  } else {
    optimizer_ = std::make_unique<optim::Optimizer>(cfg_.optim, table, plan_.range(zero().rank()));
  }

  ckpt::WriterOptions w;
  w.retention.keep_last = static_cast<int>(cfg_.ckpt.keep_last);
  w.retention.keep_every = cfg_.ckpt.keep_every;
  w.test_pause_before_commit_ms = opts_.test_pause_before_commit_ms;
  w.snapshot = ckpt::parse_snapshot(cfg_.ckpt.snapshot, "ckpt.snapshot");
  // Every rank writes its own rank file; rank 0 commits (docs/checkpoint-format.md).
  w.rank = comm_->rank();
  w.world_size = comm_->size();
  if (comm_->size() > 1) w.barrier = [this] { comm_->barrier(); };
  // A rank that has not reported its part of a checkpoint by the collective timeout is as dead as
  // one that misses a collective: rank 0's commit fails naming it, and its next save stops the run.
  w.gather_timeout_s = cfg_.parallel.timeout_s;
  writer_ = std::make_unique<ckpt::CheckpointWriter>(t.out_dir, w);

  if (!opts_.resume.empty()) {
    // Rank 0 picks the checkpoint; prepare_resume verified every checksum of it, and the run lock
    // keeps it unchanged since, so no rank's load hashes it again. Rank 0's error, if any, reaches
    // every rank instead of leaving them waiting.
    std::string dir, error;
    std::exception_ptr failed;
    if (rank0()) {
      try {
        dir = prepare_resume(t.out_dir, opts_.resume, opts_.rewind).string();
      } catch (const std::exception& e) {
        error = e.what();
        failed = std::current_exception();
      }
    }
    error = from_rank0(error);
    if (failed) std::rethrow_exception(failed);
    if (!error.empty()) throw Error(str("rank 0 could not resume: ", error));
    restore(from_rank0(dir), /*verified=*/true);
  } else if (!t.init_from.empty()) {
    // A start point: weights only (an imported HF model or another run's checkpoint); the
    // optimizer, data and schedule start fresh.
    LoadedModel src = load_model_source(t.init_from, 1, 1);
    ZAYA_CHECK(src.model->config().to_hf_json() == cfg_.model.to_hf_json(), "train.init_from = ", t.init_from,
               ": its model config differs from the run config's [model] section (",
               src.model->config().differences(cfg_.model), ", the start point's value first)");
    Tensor params = model_->params_flat(), beta = model_->balancing_biases();  // handles to the live buffers
    params.copy_from(src.model->params_flat());
    beta.copy_from(src.model->balancing_biases());
    log_info("initialized weights from ", src.source.string());
  }
  if (cfg_.has_recipe() && phase_ < 0) enter_phase(0, nullptr);  // a resumed run entered its phase
  if (master_) master_->adopt();  // the full-precision values just set become the master weights
  const GradReduce reduce = parse_grad_reduce(cfg_.parallel.grad_reduce, "parallel.grad_reduce");
  if (zero().size() > 1 || reduce == GradReduce::f64) {
    // On the weights as stored from here on (bf16 ones travel in bf16).
    const auto bucket = static_cast<int64_t>(cfg_.parallel.bucket_mb * 1048576.0 / 4);
    sync_ = std::make_unique<GradientSync>(zero_device(), plan_, model_->params_flat(), model_->grads_flat(),
                                           model_->ready_order(), reduce, std::max<int64_t>(bucket, 1));
    if (cfg_.parallel.overlap_param_gather)
      model_->set_param_need([s = sync_.get()](int64_t begin, int64_t end) { s->need_params(begin, end); });
    // The clipping norm over every shard. In the f64 mode its square is rounded to f32, so that
    // the order in which the ranks' parts were summed does not reach the update.
    optimizer_->set_sum_across_ranks([this, reduce](double x) {
      double sum = 0;
      zero().all_reduce(&x, &sum, 1, DType::f64);
      return reduce == GradReduce::f64 ? static_cast<double>(static_cast<float>(sum)) : sum;
    });
  }
}

// One trainer per run directory: the lock comes before anything reads or writes out_dir, so a
// second trainer (fresh or resuming) is refused with the first one's pid, host and start time.
void Trainer::lock_run_dir() {
  const fs::path out = cfg_.train.out_dir;
  if (rank0()) run_lock_ = std::make_unique<ckpt::RunLock>(out);
  comm_->barrier();  // no rank reads the directory before rank 0 holds it
  if (opts_.resume.empty() && (fs::exists(out / "latest") || !ckpt::list_steps(out).empty()))
    throw Error(
        "the output directory already holds checkpoints; resume with --resume, or choose another "
        "train.out_dir",
        {.file = cfg_.source, .field = "train.out_dir", .found = out.string()});
}

std::string Trainer::from_rank0(const std::string& s) {
  if (comm_->size() == 1) return s;
  const int world = comm_->size();
  int64_t n = static_cast<int64_t>(s.size());
  std::vector<int64_t> sizes(static_cast<size_t>(world));
  comm_->host_all_gather(&n, sizes.data(), sizeof n);
  std::string mine = s;
  mine.resize(static_cast<size_t>(sizes[0]));
  std::string all(static_cast<size_t>(sizes[0]) * static_cast<size_t>(world), '\0');
  comm_->host_all_gather(mine.data(), all.data(), mine.size());
  return all.substr(0, static_cast<size_t>(sizes[0]));
}

bool Trainer::any_rank(bool flag) { return comm_->size() == 1 ? flag : comm_->host_max(flag ? 1.0 : 0.0) > 0; }

std::vector<data::DatasetSpec> Trainer::phase_specs(int p) const {
  std::vector<data::DatasetSpec> specs = cfg_.data.train;
  const std::vector<double>& w = cfg_.recipe.phases.at(static_cast<size_t>(p)).data_weights;
  if (!w.empty())
    for (size_t d = 0; d < specs.size(); ++d) specs[d].weight = w[d];
  return specs;
}

void Trainer::enter_phase(int p, const std::vector<int64_t>* offsets) {
  const optim::Phase& ph = cfg_.recipe.phases.at(static_cast<size_t>(p));
  auto loader = std::make_unique<data::DataLoader>(phase_specs(p), ph.seq_len, cfg_.data.seed);
  std::vector<int64_t> start(static_cast<size_t>(loader->num_datasets()), 0);
  if (offsets) {
    start = *offsets;
  } else if (phase_ >= 0) {
    // Each dataset continues where the previous phase left it. At the same sequence length the
    // sample grid is the same, so its count carries over exactly (no sample is seen twice within
    // an epoch). A new length packs different samples, and which of them the partly read epoch
    // covered is undefined: the dataset then starts its next epoch (a fresh shuffle).
    const std::vector<int64_t> counts = train_data_->dataset_counts(train_data_->state());
    for (int d = 0; d < loader->num_datasets(); ++d) {
      const size_t i = static_cast<size_t>(d);
      if (train_data_->seq_len() == ph.seq_len) {
        start[i] = counts[i];
      } else {
        const int64_t n_old = train_data_->samples_per_epoch(d), n_new = loader->samples_per_epoch(d);
        start[i] = (counts[i] + n_old - 1) / n_old * n_new;
      }
    }
  }
  loader->set_dataset_offsets(start);
  train_data_ = std::move(loader);
  if (val_data_ && val_data_->seq_len() != ph.seq_len)
    val_data_ = std::make_unique<data::DataLoader>(std::vector<data::DatasetSpec>{{cfg_.data.val, 1.0}},
                                                   ph.seq_len, cfg_.data.seed + 1);
  if (model_->seq_len() != ph.seq_len) model_->set_batch_shape(cfg_.train.micro_batch, ph.seq_len);
  if (model_->config().rope_theta != ph.rope_theta) model_->set_rope_theta(ph.rope_theta);
  phase_ = p;
}

Trainer::~Trainer() = default;

nlohmann::json Trainer::state_json() const {
  nlohmann::json s;
  s["format"] = "zaya-train-1";
  s["written_by"] = {{"program", "zaya"}, {"version", version()}, {"commit", build_commit()}};
  s["step"] = step_;
  s["tokens"] = tokens_;
  s["data_loader_next_sample"] = train_data_->state();
  s["lr_next"] = optim::lr_at(cfg_.optim, step_ + 1);
  s["config_file"] = cfg_.source;
  s["config_toml"] = cfg_.text;
  s["config_overrides"] = cfg_.overrides;
  // The model's own config: in a recipe run its rope_theta is the current phase's, which is what
  // evaluation, generation and an HF export of this checkpoint must use.
  s["model_config"] = nlohmann::json::parse(model_->config().to_hf_json());
  s["tokenizer"] = cfg_.data.tokenizer;
  if (!tokenizer_copy_.empty()) s["tokenizer_copy"] = tokenizer_copy_;  // in the run directory
  s["seq_len"] = model_->seq_len();
  if (cfg_.has_recipe()) {
    // The loader above is this phase's; with its dataset offsets it is rebuilt exactly. The next
    // step may belong to the next phase: the resumed run makes that transition as a straight one.
    s["recipe"] = {{"phase", phase_},
                   {"phase_name", cfg_.recipe.phases[static_cast<size_t>(phase_)].name},
                   {"data_offsets", train_data_->dataset_offsets()},
                   {"batch_size", batch_}};
  }
  s["world"] = {{"size", comm_->size()}, {"data_parallel", cfg_.parallel.dp}, {"context_parallel", cfg_.parallel.cp}};
  s["rng"] = {{"init_seed", cfg_.train.seed}, {"data_seed", cfg_.data.seed}};
  s["skip_samples"] = windows_json(skip_windows_);
  return s;
}

std::vector<ckpt::SaveItem> Trainer::save_items() {
  // This rank's rows of every parameter in its ZeRO-1 range, its optimizer state, and (rank 0)
  // what every rank holds alike: the balancing biases, the counters, the balancer's moments.
  std::vector<ckpt::SaveItem> items =
      weight_items(*model_, plan_.range(zero().rank()), rank0(), master_ ? master_->master() : Tensor{});
  for (optim::Optimizer::StatePart& p : optimizer_->state_parts())
    if (!p.replicated || rank0()) items.push_back({p.name, p.tensor, p.global_shape, p.offsets});
  return items;
}

std::string Trainer::save(bool wait) {
  const FaultSpec* kill_in_save = faults_.take(FaultKind::kill_during_save, step_);
  const FaultSpec* corrupt = faults_.take(FaultKind::corrupt_ckpt, step_);
  // Held between the rank file and the commit, so the kill below lands inside the save.
  if (kill_in_save) writer_->set_test_pause_before_commit_ms(3600 * 1000);
  double stall = 0;
  beat("ckpt-snapshot");
  try {
    stall = writer_->save(step_, save_items(), rank0() ? state_json() : nlohmann::json::object());
    beat("ckpt-write");
    if (kill_in_save) {
      // The save is cut short as a node failure would cut it: the previous checkpoint must stay
      // the newest valid one.
      flush_beats();
      kill_self_once_written((fs::path(cfg_.train.out_dir) / (ckpt::step_dir_name(step_) + ".tmp") /
                              ckpt::rank_file_name(comm_->rank()))
                                 .string());
    }
    if (wait || corrupt) {
      // Rank 0's wait is the commit; the others wait until `latest` names the step, so that a run
      // that returns has its checkpoint committed on every rank.
      if (rank0()) writer_->wait();
      else writer_->wait_committed(std::max(600.0, cfg_.parallel.timeout_s));
      if (rank0()) {
        committed_seen_ = step_;
        beat("ckpt-commit");
      }
    }
  } catch (const dist::CollectiveTimeout&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointSaveFailed(str("the checkpoint of step ", step_, " failed: ", e.what()));
  }
  if (corrupt) {
    const fs::path file = fs::path(cfg_.train.out_dir) / ckpt::step_dir_name(step_) /
                          ckpt::rank_file_name(std::max(corrupt->rank, 0));
    corrupt_file(file.string());
    log_warn("fault injection: corrupted ", file.string());
  }
  std::string dir = (fs::path(cfg_.train.out_dir) / ckpt::step_dir_name(step_)).string();
  log_info("checkpoint step ", step_, " -> ", dir, " (training stalled ", static_cast<int>(stall * 1000),
           " ms", wait ? ", written" : ", writing in the background", ")");
  return dir;
}

void Trainer::check_config_change(const nlohmann::json& state, const std::string& dir) const {
  if (!state.contains("config_toml") || !state["config_toml"].is_string()) return;
  RunConfig saved;
  const std::string saved_source = str(state.value("config_file", std::string("config")), " (as stored in ", dir, ")");
  try {
    saved = parse_run_config(state["config_toml"].get<std::string>(), saved_source,
                             state.value("config_overrides", std::vector<std::string>{}));
  } catch (const Error& e) {
    // Written by a zaya whose config keys differ: nothing can be compared key by key.
    ZAYA_CHECK(opts_.allow_config_change, dir, ": the checkpoint's run config no longer parses (", e.what(),
               "), so whether this run continues it cannot be checked; pass --allow-config-change to resume anyway");
    log_warn("resume: the checkpoint's run config no longer parses (", e.what(), "); resuming as allowed");
    return;
  }
  std::vector<ConfigChange> changes = config_changes(saved, cfg_);
  // A new world size reshards the checkpoint; with grad_accum adjusted so that the global batch
  // (micro_batch × grad_accum × dp) stays the same, the run continues the same trajectory.
  const int64_t saved_dp = state.contains("world") ? state["world"].value("data_parallel", int64_t{1}) : 1;
  const int64_t saved_batch = saved.train.micro_batch * saved.train.grad_accum * saved_dp;
  const int64_t batch = cfg_.train.micro_batch * cfg_.train.grad_accum * cfg_.parallel.dp;
  for (ConfigChange& c : changes)
    if ((c.key == "train.grad_accum" || c.key == "parallel.dp") && saved_batch == batch && !cfg_.has_recipe()) c.safe = true;
  if (saved_dp != cfg_.parallel.dp)
    log_info("resume: ", saved_dp, " data-parallel ranks wrote the checkpoint, ", cfg_.parallel.dp,
             " continue it (global batch ", saved_batch, " -> ", batch, " sequences", saved_batch == batch ? ", unchanged" : "",
             ")");
  if (saved_batch != batch && saved_dp != cfg_.parallel.dp && !opts_.allow_config_change && !cfg_.has_recipe())
    throw Error(str("the checkpoint in ", dir, " was trained with a global batch of ", saved_batch, " sequences (",
                    saved.train.micro_batch, " x ", saved.train.grad_accum, " x ", saved_dp,
                    " ranks); at ", cfg_.parallel.dp, " ranks set train.grad_accum so that micro_batch x grad_accum x dp = ",
                    saved_batch, ", or pass --allow-config-change"),
                {.file = cfg_.source, .field = "train.grad_accum"});
  if (changes.empty()) return;
  std::string unsafe;
  int n_unsafe = 0;
  for (const ConfigChange& c : changes) {
    if (c.safe) {
      log_info("resume: ", c.key, " changed from ", c.was, " to ", c.now, " (safe: the trajectory stays the same)");
    } else {
      log_warn("resume: ", c.key, " changed from ", c.was, " to ", c.now,
               " (changes what the run computes: it leaves the checkpoint's trajectory)");
      unsafe += str(n_unsafe++ ? ", " : "", c.key, " ", c.was, " -> ", c.now);
    }
  }
  if (n_unsafe == 0 || opts_.allow_config_change) return;
  std::string safe_keys;
  for (const std::string& k : safe_config_keys()) safe_keys += (safe_keys.empty() ? "" : ", ") + k;
  throw Error(str("the run config changes ", n_unsafe, " setting", n_unsafe == 1 ? "" : "s",
                  " that the checkpoint in ", dir, " was trained with: ", unsafe,
                  ". Resuming would not continue that run exactly (data, batch, schedule or model differ); restore ",
                  n_unsafe == 1 ? "it" : "them",
                  ", or pass --allow-config-change to continue with the new values on purpose. Safe to change "
                  "on resume: ", safe_keys),
              {.file = cfg_.source});
}

void Trainer::restore(const std::string& where, bool verified) {
  fs::path dir = ckpt::Checkpoint::resolve(where);
  ckpt::Checkpoint c(dir);
  c.verify_on_load = !verified;
  const nlohmann::json& s = c.manifest().state;
  ZAYA_CHECK(s.value("format", "") == "zaya-train-1", dir.string(), ": not a zaya training checkpoint");
  check_config_change(s, dir.string());
  ZAYA_CHECK(s.contains("recipe") == cfg_.has_recipe(), dir.string(),
             ": the checkpoint was written by a run ", s.contains("recipe") ? "with" : "without",
             " [recipe] and the run config has ", cfg_.has_recipe() ? "one" : "none");
  if (cfg_.has_recipe()) {
    const nlohmann::json& r = s.at("recipe");
    const int p = r.at("phase").get<int>();
    ZAYA_CHECK(p >= 0 && p < static_cast<int>(cfg_.recipe.phases.size()), dir.string(), ": recipe phase ", p,
               " is not in the run config's recipe (", cfg_.recipe.phases.size(), " phases)");
    const std::vector<int64_t> offsets = r.at("data_offsets").get<std::vector<int64_t>>();
    enter_phase(p, &offsets);  // sets the model's rope_theta, compared just below
    batch_ = r.at("batch_size").get<int64_t>();
  }
  model::ModelConfig saved = checkpoint_model_config(c);
  ZAYA_CHECK(saved.to_hf_json() == model_->config().to_hf_json(), dir.string(),
             ": the checkpoint's model config differs from the run config's [model] section",
             cfg_.has_recipe() ? " (with the phase's rope_theta)" : "");
  load_weights(c, *model_);
  // This rank's part of every optimizer state tensor, whatever world size wrote them.
  for (optim::Optimizer::StatePart& p : optimizer_->state_parts()) c.load(p.name, p.tensor, p.offsets);
  optimizer_->state_parts_loaded();
  step_ = s.at("step").get<int64_t>();
  tokens_ = s.at("tokens").get<int64_t>();
  train_data_->set_state(s.at("data_loader_next_sample").get<int64_t>());
  skip_windows_ = merge_windows(windows_from_json(s, dir.string()), skip_windows_);
  log_info("resumed from ", dir.string(), ": step ", step_, ", ", tokens_, " tokens",
           cfg_.has_recipe() ? str(", recipe phase ", phase_, " '",
                                   cfg_.recipe.phases[static_cast<size_t>(phase_)].name, "'")
                             : std::string());
}

std::optional<double> Trainer::evaluate_now(const char* when, Progress& progress, MetricsSink& metrics) {
  if (!val_data_) return std::nullopt;
  auto t0 = Clock::now();
  beat("eval");
  EvalResult r = evaluate(*model_, *val_data_, cfg_.train.eval_samples, &dp(), &mesh_->cp());
  beat("eval");
  if (progress.is_bar()) std::fprintf(stderr, "\n");
  char line[160];
  std::snprintf(line, sizeof line, "validation (%s, step %lld): loss %.4f, perplexity %.2f over %lld tokens (%.1f s)",
                when, static_cast<long long>(step_), r.loss, r.perplexity, static_cast<long long>(r.tokens),
                seconds_since(t0));
  log_info(line);
  metrics.write({{"step", step_}, {"tokens", tokens_}, {"val_loss", r.loss}, {"val_perplexity", r.perplexity}});
  return r.loss;
}

// A phase starts (recipe runs): the plain log line and a metrics record. The model and loaders
// were set up by enter_phase.
void Trainer::announce_phase(int64_t batch, Progress& progress, MetricsSink& metrics) {
  const optim::Phase& ph = cfg_.recipe.phases[static_cast<size_t>(phase_)];
  std::string mix;
  std::vector<double> weights;
  for (int d = 0; d < train_data_->num_datasets(); ++d) {
    weights.push_back(train_data_->weight(d));
    mix += str(d ? ", " : "", fs::path(cfg_.data.train[static_cast<size_t>(d)].prefix).filename().string(), " ",
               train_data_->weight(d));
  }
  if (progress.is_bar()) std::fprintf(stderr, "\n");
  const int64_t micro = cfg_.train.micro_batch;
  log_info("phase ", phase_, " '", ph.name, "' starts at step ", step_ + 1, ", token ", tokens_, ": seq_len ",
           ph.seq_len, ", rope_theta ", ph.rope_theta, ", batch ", batch, " (", batch / micro, " x micro-batch ",
           micro, "), data weights ", mix);
  metrics.write({{"event", "phase_start"},
                 {"phase", phase_},
                 {"name", ph.name},
                 {"step", step_ + 1},
                 {"tokens", tokens_},
                 {"seq_len", ph.seq_len},
                 {"rope_theta", ph.rope_theta},
                 {"batch_size", batch},
                 {"data_weights", weights},
                 {"data_offsets", train_data_->dataset_offsets()}});
}

// Micro-batches of the next step; a recipe run first enters the step's phase and follows its
// batch ramp.
int64_t Trainer::prepare_step(Progress& progress, MetricsSink& metrics) {
  const int64_t micro = cfg_.train.micro_batch;
  if (!cfg_.has_recipe()) return cfg_.train.grad_accum;
  const optim::RecipeStep rs = cfg_.recipe.step_at(tokens_, micro);
  if (rs.phase != phase_) {
    enter_phase(rs.phase, nullptr);
    announce_phase(rs.batch_size, progress, metrics);
  } else if (batch_ != 0 && rs.batch_size != batch_) {
    if (progress.is_bar()) std::fprintf(stderr, "\n");
    log_info("batch ramp: ", rs.batch_size, " sequences (", rs.batch_size / micro, " x micro-batch ", micro,
             ") from step ", step_ + 1, ", token ", tokens_);
  }
  batch_ = rs.batch_size;
  return rs.batch_size / micro;
}

void Trainer::track_skipped_updates(const StepResult& r) {
  if (!r.update.skipped) {
    skipped_in_a_row_ = 0;
    last_real_update_ = step_;
    return;
  }
  ++skipped_in_a_row_;
  const double g = r.update.grad_norm;
  const std::string norm = std::isnan(g) ? "nan" : std::isinf(g) ? "inf" : str(g);
  log_warn("step ", step_, ": update skipped (gradient norm ", norm, "); ", skipped_in_a_row_, " in a row");
  if (skipped_in_a_row_ < cfg_.train.max_skipped_steps) return;
  writer_->wait();  // a save from before the streak commits; none was started during it
  const auto latest = ckpt::read_latest(cfg_.train.out_dir);
  throw NonFiniteStop(str("step ", step_, ": ", skipped_in_a_row_, " updates in a row were skipped (gradient norm ", norm,
                          " at step ", step_, ": non-finite gradients, so the weights have not changed since step ",
                          last_real_update_, "); stopping, as train.max_skipped_steps = ", cfg_.train.max_skipped_steps,
                          " says. Nothing was saved after step ", last_real_update_, "; the last checkpoint is ",
                          latest ? latest->string() : std::string("none")),
                      {.file = cfg_.source, .field = "train.max_skipped_steps"});
}

bool Trainer::may_save(const char* what) const {
  if (skipped_in_a_row_ == 0) return true;
  log_warn("not saving ", what, " at step ", step_, ": the last ", skipped_in_a_row_,
           " updates were skipped (non-finite gradients); the last checkpoint stays the newest");
  return false;
}

void Trainer::check_background_save() {
  try {
    writer_->poll();
  } catch (const dist::CollectiveTimeout&) {
    throw;
  } catch (const Error& e) {
    const auto latest = ckpt::read_latest(cfg_.train.out_dir);
    throw CheckpointSaveFailed(str("a checkpoint save failed in the background: ", e.what(), "; training stopped at step ", step_,
                                   ". The last checkpoint is ", latest ? latest->string() : std::string("none"),
                                   "; fix the cause (disk space, permissions) and resume with --resume"));
  }
  // Rank 0's background commit has landed (poll collected it).
  if (rank0() && writer_->last_stats().step > committed_seen_) {
    committed_seen_ = writer_->last_stats().step;
    beat("ckpt-commit");
  }
}

TrainResult Trainer::finished_run() const {
  log_info("the run is finished: its checkpoint is at step ", step_, " of train.steps = ", cfg_.train.steps,
           "; nothing to do");
  TrainResult r;
  r.first_step = r.last_step = step_;
  r.nothing_to_do = true;
  return r;
}

TrainResult Trainer::run() {
  try {
    TrainResult r = run_steps();
    if (sync_) sync_->settle_params();  // the last update's gather: the model is whole for the caller
    beat(r.interrupted ? "stopping" : "done");
    flush_beats();
    return r;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    beat("failed", &message);
    flush_beats();
    throw;
  }
}

void Trainer::skip_windows(int64_t micro_batches) {
  if (skip_windows_.empty()) return;
  const int64_t next = train_data_->state();
  const int64_t batch = micro_batches * cfg_.train.micro_batch * dp().size();
  const int64_t to = skip_past_windows(next, batch, skip_windows_);
  if (to == next) return;
  log_info("step ", step_ + 1, ": skipping samples [", next, ", ", to, ") (skip window)");
  train_data_->set_state(to);
}

// A rank's own part of a step: all of it but the update (which holds the gradient-norm and
// parameter-gather collectives, where a fast rank waits for a slow one) and the exposed gradient
// sync. A straggler's peers have a small own time and a step time as long as its.
namespace {
double own_time(const StepTimes& t) { return std::max(0.0, t.step - t.optimizer - t.sync.exposed_s); }
}  // namespace

void Trainer::inject_step_end() {
  if (faults_.empty()) return;
  if (faults_.take(FaultKind::kill, step_)) {
    flush_beats();
    kill_self();
  }
  if (faults_.take(FaultKind::hang, step_)) {
    flush_beats();
    hang_forever();
  }
  if (const FaultSpec* f = faults_.take(FaultKind::exit, step_)) {
    flush_beats();
    std::fflush(nullptr);
    std::_Exit(f->code);
  }
}

double Trainer::before_update(TimePoint step_start) {
  const double waited = writer_->fence();
  if (faults_.take(FaultKind::nan, step_ + 1)) {
    // In this rank's gradient range: the clipping norm over every rank becomes NaN, and the
    // optimizer's own non-finite path skips the update.
    const optim::ShardRange mine = plan_.range(zero().rank());
    poison_gradient(model_->grads_flat(), mine.begin < mine.end ? mine.begin : 0);
  }
  if (const double factor = faults_.slow_factor(step_ + 1); factor > 1) {
    const double compute = seconds_since(step_start);
    std::this_thread::sleep_for(std::chrono::duration<double>((factor - 1) * compute));
  }
  return waited;
}

TrainResult Trainer::run_steps() {
  const auto& t = cfg_.train;
  if (!opts_.resume.empty() && step_ >= t.steps) return finished_run();
  beat("start");
  if (!opts_.quiet) print_summary();
  const std::optional<PeakFlops> peak = announce_mfu_peak(cfg_, comm_->size());

  // Rank 0 writes the run's metrics; the other ranks' sink is closed.
  const auto metrics_sink = rank0() ? std::make_unique<MetricsSink>((fs::path(t.out_dir) / "metrics.jsonl").string(),
                                                                    /*resume_step=*/step_)
                                    : std::make_unique<MetricsSink>();
  MetricsSink& metrics = *metrics_sink;
  TrainResult result;
  result.first_step = step_;
  last_real_update_ = step_;
  Progress progress(step_, t.steps, t.progress && !opts_.quiet);
  const int64_t L = cfg_.model.num_hidden_layers, E = cfg_.model.num_experts;
  TrainStep train_step(*model_, *optimizer_, zero(), sync_.get(), mesh_->cp_size(), master_.get(),
                       cfg_.parallel.overlap_param_gather);
  if (cfg_.has_recipe() && step_ == 0 && step_ < t.steps)
    announce_phase(cfg_.recipe.step_at(tokens_, t.micro_batch).batch_size, progress, metrics);

  while (step_ < t.steps) {
    const int64_t micro_batches = prepare_step(progress, metrics);
    skip_windows(micro_batches);
    const double lr = optim::lr_at(cfg_.optim, step_ + 1);
    const TimePoint step_start = Clock::now();
    if (cp_group_) cp_group_->reset_counters();  // the step's own exchanges, not an evaluation's
    const StepResult r = train_step.run(*train_data_, micro_batches, lr, [&] { return before_update(step_start); });
    ++step_;
    tokens_ += r.tokens;
    result.losses.push_back(r.loss);
    result.phases.push_back(std::max(phase_, 0));
    result.batch_sizes.push_back(r.sequences);

    // Metrics.
    const ExpertLoads loads = expert_loads(r.expert_counts, r.skipped, L, E);
    nlohmann::json rec =
        step_record(r, step_, tokens_, model::training_flops_per_token(cfg_.model, model_->seq_len()), peak, loads);
    if (cfg_.has_recipe()) {
      rec["phase"] = phase_;
      rec["batch_size"] = batch_;
      rec["seq_len"] = model_->seq_len();
    }
    if (cp_group_) {  // rank 0's context-parallel traffic this step (every cp rank sends the same)
      rec["context_parallel"] = {{"bytes_sent", cp_group_->bytes_sent()},
                                 {"exchanges", cp_group_->calls()},
                                 {"blocked_s", cp_group_->blocked_seconds()}};
    }
    metrics.write(rec);
    char extra[96];
    if (cfg_.has_recipe())
      std::snprintf(extra, sizeof extra, "lr %.2e  |g| %.2f  H_min %.3f  phase %d  batch %lld", lr,
                    r.update.grad_norm, loads.min_entropy, phase_, static_cast<long long>(batch_));
    else
      std::snprintf(extra, sizeof extra, "lr %.2e  |g| %.2f  H_min %.3f", lr, r.update.grad_norm, loads.min_entropy);
    progress.update(step_ - 1, r.loss, static_cast<double>(r.tokens) / r.time.step, t.log_every, extra);
    if (!std::isfinite(r.loss)) log_warn("step ", step_, ": non-finite loss");
    if (heartbeat_) heartbeat_->step_end(step_, r.loss, r.update.grad_norm, r.time.step, own_time(r.time));
    if (step_ == result.first_step + 1 && !opts_.quiet) log_measured_memory();
    inject_step_end();
    track_skipped_updates(r);
    check_background_save();

    // Evaluation and checkpoint policies.
    const bool stop_requested =
        any_rank(opts_.stop && opts_.stop->load()) ||
        (opts_.stop_after_steps >= 0 && step_ - result.first_step >= opts_.stop_after_steps);
    if (t.eval_every > 0 && step_ % t.eval_every == 0 && step_ < t.steps)
      evaluate_now("periodic", progress, metrics);
    if (stop_requested) {
      if (progress.is_bar()) std::fprintf(stderr, "\n");
      log_info("stop requested at step ", step_, ": saving a checkpoint");
      if (may_save("the checkpoint of the stop")) result.last_checkpoint = save(/*wait=*/true);
      result.interrupted = true;
      result.last_step = step_;
      return result;
    }
    if (cfg_.ckpt.every > 0 && step_ % cfg_.ckpt.every == 0 && step_ < t.steps && may_save("the periodic checkpoint"))
      result.last_checkpoint = save(false);
  }
  progress.finish();
  result.final_val_loss = evaluate_now("final", progress, metrics);
  if (cfg_.ckpt.save_final && may_save("the final checkpoint")) result.last_checkpoint = save(/*wait=*/true);
  writer_->wait();
  result.last_step = step_;
  return result;
}

}  // namespace zaya::train
