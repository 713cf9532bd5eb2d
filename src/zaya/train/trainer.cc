#include "zaya/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/log.h"
#include "zaya/core/threads.h"
#include "zaya/data/tokenizer.h"
#include "zaya/model/params.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"
#include "zaya/optim/schedule.h"
#include "zaya/train/batch.h"
#include "zaya/train/model_io.h"

namespace zaya::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string human_bytes(double b) {
  char s[32];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(s, sizeof s, "%.1f MiB", b / (1024.0 * 1024));
  return s;
}

std::atomic<bool>* g_stop_flag = nullptr;
extern "C" void on_stop_signal(int sig) {
  if (g_stop_flag && !g_stop_flag->load()) {
    g_stop_flag->store(true);
    return;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_stop_handlers(std::atomic<bool>* flag) {
  g_stop_flag = flag;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

Trainer::Trainer(RunConfig config, TrainOptions options)
    : cfg_(std::move(config)), opts_(std::move(options)) {
  const auto& t = cfg_.train;
  train_data_ = std::make_unique<data::DataLoader>(cfg_.data.train, t.seq_len, cfg_.data.seed);
  for (int d = 0; d < train_data_->num_datasets(); ++d)
    ZAYA_CHECK(train_data_->samples_per_epoch(d) > 0, cfg_.data.train[static_cast<size_t>(d)].prefix,
               ": too few tokens for one sample of ", t.seq_len + 1, " tokens");
  if (!cfg_.data.val.empty())
    val_data_ = std::make_unique<data::DataLoader>(std::vector<data::DatasetSpec>{{cfg_.data.val, 1.0}},
                                                   t.seq_len, cfg_.data.seed + 1);
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
  }

  model_ = std::make_unique<model::ZayaModel>(cfg_.model, t.micro_batch, t.seq_len);
  model_->init(t.seed);
  if (t.gemm_dtype == "bf16") {
    model_->set_gemm_dtype(DType::bf16);
    if (!ops::cpu::gemm_bf16_native())
      log_warn(
          "train.gemm_dtype = \"bf16\": this CPU has no native bf16 matmul (avx512_bf16 or AMX), so "
          "the bf16 GEMMs run in f32 on widened copies, slower than train.gemm_dtype = \"f32\"");
  }
  optimizer_ = std::make_unique<optim::Optimizer>(cfg_.optim, *model_);

  if (opts_.resume.empty() && fs::exists(fs::path(t.out_dir) / "latest"))
    throw Error(
        "the output directory already holds checkpoints; resume with --resume, or choose another "
        "train.out_dir",
        {.file = cfg_.source, .field = "train.out_dir", .found = t.out_dir});
  fs::create_directories(t.out_dir);
  ckpt::WriterOptions w;
  w.retention.keep_last = static_cast<int>(cfg_.ckpt.keep_last);
  w.retention.keep_every = cfg_.ckpt.keep_every;
  w.test_pause_before_commit_ms = opts_.test_pause_before_commit_ms;
  w.snapshot = ckpt::parse_snapshot(cfg_.ckpt.snapshot, "ckpt.snapshot");
  writer_ = std::make_unique<ckpt::CheckpointWriter>(t.out_dir, w);

  if (!opts_.resume.empty()) {
    restore(opts_.resume == "latest" ? t.out_dir : opts_.resume);
  } else if (!t.init_from.empty()) {
    // A start point: weights only (an imported HF model or another run's checkpoint); the
    // optimizer, data and schedule start fresh.
    LoadedModel src = load_model_source(t.init_from, 1, 1);
    ZAYA_CHECK(src.model->config().to_hf_json() == cfg_.model.to_hf_json(), "train.init_from = ", t.init_from,
               ": its model config differs from the run config's [model] section");
    Tensor params = model_->params_flat(), beta = model_->balancing_biases();  // handles to the live buffers
    params.copy_from(src.model->params_flat());
    beta.copy_from(src.model->balancing_biases());
    log_info("initialized weights from ", src.source.string());
  }
  if (cfg_.has_recipe() && phase_ < 0) enter_phase(0, nullptr);  // a resumed run entered its phase
}

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

double Trainer::measure_gemm_peak() const {
  // The MFU denominator: this machine's f32 GEMM rate on a large square problem, with the run's
  // thread count (llm.c reports MFU against a peak; here the peak is measured, not a datasheet).
  const int64_t n = 1024;
  Tensor a = Tensor::empty({n, n}, DType::f32), b = Tensor::empty({n, n}, DType::f32),
         c = Tensor::empty({n, n}, DType::f32);
  a.fill_(0.5);
  b.fill_(0.25);
  ops::gemm(a, ops::Trans::N, b, ops::Trans::N, c);
  // The best of several short trials: a peak is what the machine can do, and a single trial on a
  // shared or frequency-scaling machine reads low (seen: 84 vs 225 GFLOP/s minutes apart).
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    auto t0 = Clock::now();
    const int reps = 3;
    for (int i = 0; i < reps; ++i) ops::gemm(a, ops::Trans::N, b, ops::Trans::N, c);
    best = std::max(best, 2.0 * n * n * n * reps / seconds_since(t0));
  }
  return best;
}

void Trainer::print_summary() const {
  const auto& c = cfg_.model;
  model::ParamCounts n = model::count_parameters(c);
  const double P = static_cast<double>(n.total);
  log_info("model: H ", c.hidden_size, ", L ", c.num_hidden_layers, ", heads ", c.num_attention_heads, "/",
           c.num_key_value_heads, "x", c.head_dim, ", experts ", c.num_experts, "x", c.moe_intermediate_size,
           ", router ", c.router_hidden_size, ", vocab ", c.vocab_size);
  char line[256];
  std::snprintf(line, sizeof line,
                "parameters: total %.2fM, active %.2fM, embedding %.2fM, non-embedding %.2fM", P / 1e6,
                n.active / 1e6, n.embedding / 1e6, n.non_embedding / 1e6);
  log_info(line);
  log_info("memory: weights ", human_bytes(4 * P), " (f32), gradients ", human_bytes(4 * P),
           ", optimizer state ", human_bytes(static_cast<double>(optimizer_->state_bytes())),
           ", activations ", human_bytes(static_cast<double>(model_->activation_bytes())), " (",
           cfg_.train.micro_batch, "x", cfg_.train.seq_len,
           " tokens per micro-batch); expert and LM-head GEMMs ",
           cfg_.train.gemm_dtype == "bf16" ? "bf16 inputs, f32 accumulation" : "f32");
  log_info("optimizer: ", optimizer_->summary().str());
  if (!cfg_.has_recipe()) {
    log_info("batch: ", cfg_.train.micro_batch, " x ", cfg_.train.seq_len, " x ", cfg_.train.grad_accum,
             " accumulation = ", cfg_.tokens_per_step(), " tokens per step; ", cfg_.train.steps,
             " steps = ", cfg_.tokens_per_step() * cfg_.train.steps, " tokens; threads ", num_threads());
    return;
  }
  const optim::Recipe& r = cfg_.recipe;
  log_info("recipe: ", r.phases.size(), " phases, ", r.total_tokens(), " tokens in ",
           r.num_steps(cfg_.train.micro_batch), " steps (this run: ", cfg_.train.steps, "); micro-batch ",
           cfg_.train.micro_batch, "; threads ", num_threads());
  for (size_t p = 0; p < r.phases.size(); ++p) {
    const optim::Phase& ph = r.phases[p];
    log_info("  phase ", p, " '", ph.name, "': ", ph.tokens, " tokens, seq_len ", ph.seq_len, ", rope_theta ",
             ph.rope_theta, ", batch ", ph.batch_size, " (", ph.batch_size / cfg_.train.micro_batch,
             " x micro-batch ", cfg_.train.micro_batch, ")");
  }
  if (r.batch_ramp_start > 0 && r.batch_ramp_tokens > 0)
    log_info("  batch ramp: ", r.batch_ramp_start, " -> ", r.phases[0].batch_size,
             " sequences over the first ", r.batch_ramp_tokens, " tokens");
}

nlohmann::json Trainer::state_json() const {
  nlohmann::json s;
  s["format"] = "zaya-train-1";
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
  s["seq_len"] = model_->seq_len();
  if (cfg_.has_recipe()) {
    // The loader above is this phase's; with its dataset offsets it is rebuilt exactly. The next
    // step may belong to the next phase: the resumed run makes that transition as a straight one.
    s["recipe"] = {{"phase", phase_},
                   {"phase_name", cfg_.recipe.phases[static_cast<size_t>(phase_)].name},
                   {"data_offsets", train_data_->dataset_offsets()},
                   {"batch_size", batch_}};
  }
  s["world"] = {{"size", 1}, {"data_parallel", 1}};
  s["rng"] = {{"init_seed", cfg_.train.seed}, {"data_seed", cfg_.data.seed}};
  return s;
}

std::string Trainer::save(bool wait) {
  std::vector<ckpt::SaveItem> items = weight_items(*model_);
  for (auto& [name, t] : optimizer_->state_tensors()) items.push_back({name, t, {}, {}});
  double stall = writer_->save(step_, items, state_json());
  if (wait) writer_->wait();
  std::string dir = (fs::path(cfg_.train.out_dir) / ckpt::step_dir_name(step_)).string();
  log_info("checkpoint step ", step_, " -> ", dir, " (training stalled ", static_cast<int>(stall * 1000),
           " ms", wait ? ", written" : ", writing in the background", ")");
  return dir;
}

void Trainer::restore(const std::string& where) {
  fs::path dir = ckpt::Checkpoint::resolve(where);
  ckpt::Checkpoint c(dir);
  const nlohmann::json& s = c.manifest().state;
  ZAYA_CHECK(s.value("format", "") == "zaya-train-1", dir.string(), ": not a zaya training checkpoint");
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
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : optimizer_->state_tensors()) state[name] = c.load_full(name);
  optimizer_->load_state(state);
  step_ = s.at("step").get<int64_t>();
  tokens_ = s.at("tokens").get<int64_t>();
  train_data_->set_state(s.at("data_loader_next_sample").get<int64_t>());
  log_info("resumed from ", dir.string(), ": step ", step_, ", ", tokens_, " tokens",
           cfg_.has_recipe() ? str(", recipe phase ", phase_, " '",
                                   cfg_.recipe.phases[static_cast<size_t>(phase_)].name, "'")
                             : std::string());
}

TrainResult Trainer::run() {
  const auto& t = cfg_.train;
  if (!opts_.quiet) print_summary();
  const double peak = measure_gemm_peak();
  double flops_per_token = model::training_flops_per_token(cfg_.model, model_->seq_len());
  log_info("MFU denominator: measured f32 GEMM peak ", static_cast<int>(peak / 1e9), " GFLOP/s (1024^3, ",
           num_threads(), " threads)");

  MetricsSink metrics((fs::path(t.out_dir) / "metrics.jsonl").string(), /*append=*/step_ > 0);
  TrainResult result;
  result.first_step = step_;
  Progress progress(step_, t.steps, t.progress && !opts_.quiet);
  const int64_t L = cfg_.model.num_hidden_layers, E = cfg_.model.num_experts;

  Tensor rows, ids, targets;  // [micro_batch, seq_len (+1)], reshaped when a phase changes seq_len
  auto shape_batch = [&] {
    const int64_t T = model_->seq_len();
    rows = Tensor::empty({t.micro_batch, T + 1}, DType::i32);
    ids = Tensor::empty({t.micro_batch, T}, DType::i32);
    targets = Tensor::empty({t.micro_batch, T}, DType::i32);
    flops_per_token = model::training_flops_per_token(cfg_.model, T);
  };
  shape_batch();
  std::vector<int64_t> counts;
  std::vector<int64_t> skipped(static_cast<size_t>(L));

  auto evaluate_now = [&](const char* when) -> std::optional<double> {
    if (!val_data_) return std::nullopt;
    auto t0 = Clock::now();
    EvalResult r = evaluate(*model_, *val_data_, t.eval_samples);
    if (progress.is_bar()) std::fprintf(stderr, "\n");
    char line[160];
    std::snprintf(line, sizeof line,
                  "validation (%s, step %lld): loss %.4f, perplexity %.2f over %lld tokens (%.1f s)", when,
                  static_cast<long long>(step_), r.loss, r.perplexity, static_cast<long long>(r.tokens),
                  seconds_since(t0));
    log_info(line);
    metrics.write(
        {{"step", step_}, {"tokens", tokens_}, {"val_loss", r.loss}, {"val_perplexity", r.perplexity}});
    return r.loss;
  };

  // A phase starts (recipe runs): the plain log line and a metrics record. The model and loaders
  // were set up by enter_phase.
  auto announce_phase = [&](int64_t batch) {
    const optim::Phase& ph = cfg_.recipe.phases[static_cast<size_t>(phase_)];
    std::string mix;
    std::vector<double> weights;
    for (int d = 0; d < train_data_->num_datasets(); ++d) {
      weights.push_back(train_data_->weight(d));
      mix += str(d ? ", " : "", fs::path(cfg_.data.train[static_cast<size_t>(d)].prefix).filename().string(),
                 " ", train_data_->weight(d));
    }
    if (progress.is_bar()) std::fprintf(stderr, "\n");
    log_info("phase ", phase_, " '", ph.name, "' starts at step ", step_ + 1, ", token ", tokens_,
             ": seq_len ", ph.seq_len, ", rope_theta ", ph.rope_theta, ", batch ", batch, " (",
             batch / t.micro_batch, " x micro-batch ", t.micro_batch, "), data weights ", mix);
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
  };
  if (cfg_.has_recipe() && step_ == 0 && step_ < t.steps)
    announce_phase(cfg_.recipe.step_at(tokens_, t.micro_batch).batch_size);

  while (step_ < t.steps) {
    int64_t n_micro = t.grad_accum;
    if (cfg_.has_recipe()) {
      const optim::RecipeStep rs = cfg_.recipe.step_at(tokens_, t.micro_batch);
      if (rs.phase != phase_) {
        enter_phase(rs.phase, nullptr);
        if (rows.size(1) != model_->seq_len() + 1) shape_batch();
        announce_phase(rs.batch_size);
      } else if (batch_ != 0 && rs.batch_size != batch_) {
        if (progress.is_bar()) std::fprintf(stderr, "\n");
        log_info("batch ramp: ", rs.batch_size, " sequences (", rs.batch_size / t.micro_batch,
                 " x micro-batch ", t.micro_batch, ") from step ", step_ + 1, ", token ", tokens_);
      }
      batch_ = rs.batch_size;
      n_micro = rs.batch_size / t.micro_batch;
    }
    const int64_t step_tokens = n_micro * t.micro_batch * model_->seq_len();
    auto step_start = Clock::now();
    double t_data = 0, t_fwd = 0, t_bwd = 0;
    double loss = 0;
    counts.assign(static_cast<size_t>(L * E), 0);
    std::fill(skipped.begin(), skipped.end(), 0);
    for (int64_t micro = 0; micro < n_micro; ++micro) {
      auto t0 = Clock::now();
      train_data_->next_batch(0, 1, rows);
      split_rows(rows, ids, targets);
      auto t1 = Clock::now();
      loss += model_->forward(ids, targets) / static_cast<double>(n_micro);
      auto t2 = Clock::now();
      model_->backward();
      auto t3 = Clock::now();
      optim::Optimizer::accumulate_router_counts(*model_, counts);
      auto stats = model_->router_stats();
      for (int64_t l = 0; l < L; ++l)
        skipped[static_cast<size_t>(l)] += stats[static_cast<size_t>(l)].skipped;
      t_data += std::chrono::duration<double>(t1 - t0).count();
      t_fwd += std::chrono::duration<double>(t2 - t1).count();
      t_bwd += std::chrono::duration<double>(t3 - t2).count();
    }
    // Gradients were summed over micro-batches of equal token counts: average them.
    if (n_micro > 1) {
      float s = 1.0f / static_cast<float>(n_micro);
      float* g = model_->grads_flat().data<float>();
      for (int64_t i = 0; i < model_->grads_flat().numel(); ++i) g[i] *= s;
    }
    // A deferred checkpoint snapshot copies the parameters and optimizer state while this step's
    // forward and backward run; the optimizer must not change them before that copy is done.
    const double t_fence = writer_->fence();
    auto t_opt0 = Clock::now();
    const double lr = optim::lr_at(cfg_.optim, step_ + 1);
    optim::StepStats st = optimizer_->step(*model_, lr);
    optimizer_->balance_step(*model_, counts, lr);
    double t_opt = seconds_since(t_opt0);
    ++step_;
    tokens_ += step_tokens;
    result.losses.push_back(loss);
    result.phases.push_back(std::max(phase_, 0));
    result.batch_sizes.push_back(n_micro * t.micro_batch);

    const double dt = seconds_since(step_start);
    const double tok_s = static_cast<double>(step_tokens) / dt;
    const double mfu = flops_per_token * tok_s / peak;
    nlohmann::json rec = {{"step", step_},
                          {"tokens", tokens_},
                          {"loss", loss},
                          {"lr", lr},
                          {"grad_norm", st.grad_norm},
                          {"clipped", st.clipped},
                          {"skipped_update", st.skipped},
                          {"tokens_per_s", tok_s},
                          {"mfu", mfu},
                          {"time",
                           {{"data", t_data},
                            {"forward", t_fwd},
                            {"backward", t_bwd},
                            {"optimizer", t_opt},
                            {"checkpoint_fence", t_fence},
                            {"step", dt}}}};
    // Expert loads: entropy of the routed-token distribution normalized by ln E (1 = uniform),
    // max/min load relative to uniform (1 = its fair share), and the skip fraction.
    std::vector<double> entropy, max_load, min_load, skip_frac;
    double min_entropy = 1;
    for (int64_t l = 0; l < L; ++l) {
      int64_t routed = 0;
      for (int64_t e = 0; e < E; ++e) routed += counts[static_cast<size_t>(l * E + e)];
      double h = 0, mx = 0, mn = 1e30;
      for (int64_t e = 0; e < E; ++e) {
        double f =
            routed ? static_cast<double>(counts[static_cast<size_t>(l * E + e)]) / static_cast<double>(routed)
                   : 0;
        if (f > 0) h -= f * std::log(f);
        mx = std::max(mx, f * static_cast<double>(E));
        mn = std::min(mn, f * static_cast<double>(E));
      }
      double hn = E > 1 ? h / std::log(static_cast<double>(E)) : 1.0;
      entropy.push_back(hn);
      max_load.push_back(mx);
      min_load.push_back(mn);
      skip_frac.push_back(static_cast<double>(skipped[static_cast<size_t>(l)]) /
                          static_cast<double>(routed + skipped[static_cast<size_t>(l)]));
      min_entropy = std::min(min_entropy, hn);
    }
    if (cfg_.has_recipe()) {
      rec["phase"] = phase_;
      rec["batch_size"] = batch_;
      rec["seq_len"] = model_->seq_len();
    }
    rec["expert_entropy"] = entropy;
    rec["expert_max_load"] = max_load;
    rec["expert_min_load"] = min_load;
    rec["skip_fraction"] = skip_frac;
    metrics.write(rec);
    char extra[96];
    if (cfg_.has_recipe())
      std::snprintf(extra, sizeof extra, "lr %.2e  |g| %.2f  H_min %.3f  phase %d  batch %lld", lr,
                    st.grad_norm, min_entropy, phase_, static_cast<long long>(batch_));
    else
      std::snprintf(extra, sizeof extra, "lr %.2e  |g| %.2f  H_min %.3f", lr, st.grad_norm, min_entropy);
    progress.update(step_ - 1, loss, tok_s, t.log_every, extra);
    if (!std::isfinite(loss)) log_warn("step ", step_, ": non-finite loss");

    bool stop_requested =
        (opts_.stop && opts_.stop->load()) ||
        (opts_.stop_after_steps >= 0 && step_ - result.first_step >= opts_.stop_after_steps);
    if (t.eval_every > 0 && step_ % t.eval_every == 0 && step_ < t.steps) evaluate_now("periodic");
    if (stop_requested) {
      if (progress.is_bar()) std::fprintf(stderr, "\n");
      log_info("stop requested at step ", step_, ": saving a checkpoint");
      result.last_checkpoint = save(/*wait=*/true);
      result.interrupted = true;
      result.last_step = step_;
      return result;
    }
    if (cfg_.ckpt.every > 0 && step_ % cfg_.ckpt.every == 0 && step_ < t.steps)
      result.last_checkpoint = save(false);
  }
  progress.finish();
  result.final_val_loss = evaluate_now("final");
  if (cfg_.ckpt.save_final) result.last_checkpoint = save(/*wait=*/true);
  writer_->wait();
  result.last_step = step_;
  return result;
}

}  // namespace zaya::train
