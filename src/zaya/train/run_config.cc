#include "zaya/train/run_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/core/log.h"
#include "zaya/train/fault_inject.h"
#include "zaya/train/mfu_peak.h"

namespace zaya::train {
namespace {

void need(bool ok, const std::string& source, const std::string& key, const std::string& expected,
          const std::string& found) {
  if (!ok)
    throw Error("invalid run config", {.file = source, .field = key, .expected = expected, .found = found});
}

DataConfig read_data(ConfigReader& r) {
  DataConfig d;
  std::vector<std::string> prefixes;
  std::vector<double> weights;
  r.get("data.train", prefixes);
  r.get("data.weights", weights);
  r.get("data.val", d.val);
  r.get("data.tokenizer", d.tokenizer);
  int64_t seed = static_cast<int64_t>(d.seed);
  r.get("data.seed", seed);
  d.seed = static_cast<uint64_t>(seed);
  need(!prefixes.empty(), r.file(), "data.train", "a list of dataset prefixes (from `zaya data prepare`)",
       "nothing");
  need(weights.empty() || weights.size() == prefixes.size(), r.file(), "data.weights",
       "one weight per data.train entry (" + std::to_string(prefixes.size()) + ")",
       std::to_string(weights.size()));
  for (size_t i = 0; i < prefixes.size(); ++i) {
    double w = weights.empty() ? 1.0 : weights[i];
    need(w > 0, r.file(), "data.weights", "positive weights", std::to_string(w));
    d.train.push_back({prefixes[i], w});
  }
  return d;
}

TrainConfig read_train(ConfigReader& r) {
  TrainConfig t;
  r.get("train.steps", t.steps);
  r.get("train.micro_batch", t.micro_batch);
  r.get("train.seq_len", t.seq_len);
  r.get("train.grad_accum", t.grad_accum);
  int64_t seed = static_cast<int64_t>(t.seed);
  r.get("train.seed", seed);
  t.seed = static_cast<uint64_t>(seed);
  r.get("train.log_every", t.log_every);
  r.get("train.eval_every", t.eval_every);
  r.get("train.eval_samples", t.eval_samples);
  r.get("train.out_dir", t.out_dir);
  r.get("train.progress", t.progress);
  r.get("train.init_from", t.init_from);
  r.get("train.gemm_dtype", t.gemm_dtype);
  r.get("train.param_dtype", t.param_dtype);
  r.get("train.activation_dtype", t.activation_dtype);
  r.get("train.recompute", t.recompute);
  r.get("train.max_skipped_steps", t.max_skipped_steps);
  r.get("train.heartbeat", t.heartbeat);
  r.get("train.inject", t.inject);
  r.get("train.mfu_peak", t.mfu_peak);
  r.get("train.mfu_peak_flops", t.mfu_peak_flops);
  for (const std::string& spec : t.inject) {
    try {
      parse_fault_spec(spec);
    } catch (const Error& e) {
      throw Error(str(r.file(), ": train.inject: ", e.what()));
    }
  }
  need(t.steps > 0, r.file(), "train.steps", "> 0", std::to_string(t.steps));
  need(t.micro_batch > 0, r.file(), "train.micro_batch", "> 0", std::to_string(t.micro_batch));
  need(t.seq_len > 0, r.file(), "train.seq_len", "> 0", std::to_string(t.seq_len));
  need(t.grad_accum > 0, r.file(), "train.grad_accum", "> 0", std::to_string(t.grad_accum));
  need(t.log_every > 0, r.file(), "train.log_every", "> 0", std::to_string(t.log_every));
  need(t.eval_every >= 0, r.file(), "train.eval_every", ">= 0", std::to_string(t.eval_every));
  need(t.eval_samples > 0, r.file(), "train.eval_samples", "> 0", std::to_string(t.eval_samples));
  need(t.max_skipped_steps > 0, r.file(), "train.max_skipped_steps", "> 0", std::to_string(t.max_skipped_steps));
  need(!t.out_dir.empty(), r.file(), "train.out_dir", "a directory", "\"\"");
  need(t.mfu_peak == "auto" || t.mfu_peak == "cpu" || datasheet_peak(t.mfu_peak).has_value() ||
           t.mfu_peak_flops > 0,
       r.file(), "train.mfu_peak", mfu_peak_choices() + " (or any name with train.mfu_peak_flops)",
       "\"" + t.mfu_peak + "\"");
  need(t.mfu_peak_flops >= 0 && std::isfinite(t.mfu_peak_flops), r.file(), "train.mfu_peak_flops",
       ">= 0 (FLOP/s per rank; 0: from train.mfu_peak)", std::to_string(t.mfu_peak_flops));
  need(t.gemm_dtype == "f32" || t.gemm_dtype == "bf16", r.file(), "train.gemm_dtype", "\"f32\" or \"bf16\"",
       "\"" + t.gemm_dtype + "\"");
  need(t.param_dtype == "f32" || t.param_dtype == "bf16", r.file(), "train.param_dtype", "\"f32\" or \"bf16\"",
       "\"" + t.param_dtype + "\"");
  need(t.activation_dtype == "f32" || t.activation_dtype == "bf16", r.file(), "train.activation_dtype",
       "\"f32\" or \"bf16\"", "\"" + t.activation_dtype + "\"");
  need(t.activation_dtype == "f32" || t.gemm_dtype == "bf16", r.file(), "train.gemm_dtype",
       "\"bf16\" with train.activation_dtype = \"bf16\"", "\"" + t.gemm_dtype + "\"");
  // The weight GEMMs read the stored bf16 weights as they are.
  need(t.param_dtype == "f32" || t.gemm_dtype == "bf16", r.file(), "train.gemm_dtype",
       "\"bf16\" with train.param_dtype = \"bf16\" (bf16 weights are stored in bf16 and the GEMMs read them "
       "as they are)",
       "\"" + t.gemm_dtype + "\"");
  return t;
}

CkptConfig read_ckpt(ConfigReader& r) {
  CkptConfig c;
  r.get("ckpt.every", c.every);
  r.get("ckpt.keep_last", c.keep_last);
  r.get("ckpt.keep_every", c.keep_every);
  r.get("ckpt.save_final", c.save_final);
  r.get("ckpt.snapshot", c.snapshot);
  need(c.snapshot == "copy" || c.snapshot == "fork" || c.snapshot == "deferred", r.file(), "ckpt.snapshot",
       "\"deferred\", \"copy\" or \"fork\"", c.snapshot);
  need(c.every >= 0, r.file(), "ckpt.every", ">= 0", std::to_string(c.every));
  need(c.keep_last >= 1, r.file(), "ckpt.keep_last", ">= 1", std::to_string(c.keep_last));
  need(c.keep_every >= 0, r.file(), "ckpt.keep_every", ">= 0", std::to_string(c.keep_every));
  return c;
}

ParallelConfig read_parallel(ConfigReader& r) {
  ParallelConfig p;
  r.get("parallel.device", p.device);
  r.get("parallel.dp", p.dp);
  r.get("parallel.cp", p.cp);
  r.get("parallel.cp_overlap", p.cp_overlap);
  r.get("parallel.bucket_mb", p.bucket_mb);
  r.get("parallel.grad_reduce", p.grad_reduce);
  r.get("parallel.overlap_param_gather", p.overlap_param_gather);
  r.get("parallel.timeout_s", p.timeout_s);
  need(p.device == "cpu" || p.device == "cuda", r.file(), "parallel.device", "\"cpu\" or \"cuda\"",
       "\"" + p.device + "\"");
  need(p.dp >= 0, r.file(), "parallel.dp", ">= 1, or 0 for the world size / parallel.cp", std::to_string(p.dp));
  need(p.cp >= 1, r.file(), "parallel.cp", ">= 1", std::to_string(p.cp));
  need(p.bucket_mb > 0 && p.bucket_mb <= 4096, r.file(), "parallel.bucket_mb", "in (0, 4096] MiB",
       std::to_string(p.bucket_mb));
  need(p.grad_reduce == "f32" || p.grad_reduce == "bf16" || p.grad_reduce == "f64", r.file(), "parallel.grad_reduce",
       "\"f32\", \"bf16\" or \"f64\"", "\"" + p.grad_reduce + "\"");
  need(p.timeout_s > 0, r.file(), "parallel.timeout_s", "> 0 seconds", std::to_string(p.timeout_s));
  return p;
}

// The most optimizer steps a recipe may take: far beyond any real run (ten million steps of one
// second each take four months) and few enough to count in about a second.
constexpr int64_t kMaxRecipeSteps = 10'000'000;

// Cross-checks [recipe] against [model], [data] and [train] and derives the run length.
void check_recipe(RunConfig& c, bool explicit_steps, bool explicit_seq, bool explicit_accum,
                  bool explicit_total) {
  const std::string& src = c.source;
  optim::Recipe& rec = c.recipe;
  const int64_t micro = c.train.micro_batch;
  // With a recipe these come from the phases; a second source of truth would be ignored silently.
  need(!explicit_seq, src, "train.seq_len", "no value: with [recipe] each phase sets seq_len",
       std::to_string(c.train.seq_len));
  need(!explicit_accum, src, "train.grad_accum",
       "no value: with [recipe] the micro-batches per step are batch_size / train.micro_batch",
       std::to_string(c.train.grad_accum));
  const size_t n_data = c.data.train.size();
  for (size_t i = 0; i < rec.phases.size(); ++i) {
    optim::Phase& p = rec.phases[i];
    const std::string k = "recipe.phases[" + std::to_string(i) + "].";
    need(p.seq_len <= c.model.max_position_embeddings, src, k + "seq_len",
         "at most model.max_position_embeddings (" + std::to_string(c.model.max_position_embeddings) + ")",
         std::to_string(p.seq_len));
    need(p.batch_size % micro == 0, src, k + "batch_size",
         "a multiple of train.micro_batch (" + std::to_string(micro) + ")", std::to_string(p.batch_size));
    need(p.data_weights.empty() || p.data_weights.size() == n_data, src, k + "data_weights",
         "one weight per data.train entry (" + std::to_string(n_data) + "), in the same order",
         std::to_string(p.data_weights.size()) + " weights");
    if (p.rope_theta == 0) p.rope_theta = c.model.rope_theta;
  }
  need(rec.batch_ramp_start % micro == 0, src, "recipe.batch_ramp_start",
       "a multiple of train.micro_batch (" + std::to_string(micro) + ")",
       std::to_string(rec.batch_ramp_start));
  // Every phase must get at least one step (a step never straddles phases, so a phase shorter than
  // the previous phase's overshoot would be skipped).
  // The steps are counted one by one below: a recipe of absurdly many (tokens off by a unit, a tiny
  // batch) must fail, not hang. No step takes more than the largest batch_size x seq_len, which
  // rejects most such recipes at once; the check in the loop bounds the rest (ramps).
  int64_t max_step_tokens = 0;
  for (const optim::Phase& p : rec.phases)
    max_step_tokens = std::max(max_step_tokens, p.seq_len * p.batch_size);
  const std::string too_many = "at most " + std::to_string(kMaxRecipeSteps) + " optimizer steps in all";
  need(rec.total_tokens() / max_step_tokens <= kMaxRecipeSteps, src, "recipe.phases", too_many,
       "at least " + std::to_string(rec.total_tokens() / max_step_tokens) +
           " (the phases' tokens over the largest batch_size x seq_len)");
  std::vector<int64_t> steps_in(rec.phases.size(), 0);
  int64_t steps = 0;
  for (int64_t consumed = 0; consumed < rec.total_tokens(); ++steps) {
    need(steps < kMaxRecipeSteps, src, "recipe.phases", too_many, "more (the batch ramp's small batches)");
    optim::RecipeStep st = rec.step_at(consumed, micro);
    ++steps_in[static_cast<size_t>(st.phase)];
    consumed += st.tokens();
  }
  for (size_t i = 0; i < rec.phases.size(); ++i)
    need(steps_in[i] > 0, src, "recipe.phases[" + std::to_string(i) + "].tokens",
         "enough tokens for at least one step after the previous phase's last step",
         std::to_string(rec.phases[i].tokens));
  if (explicit_steps) {
    need(c.train.steps <= steps, src, "train.steps",
         "at most the " + std::to_string(steps) + " steps the recipe takes (or no value: the recipe decides)",
         std::to_string(c.train.steps));
  } else {
    c.train.steps = steps;
  }
  // The schedule spans the recipe, also when train.steps stops the run earlier (a smoke run
  // follows the real schedule's first steps).
  if (!explicit_total) c.optim.total_steps = steps;
  c.train.seq_len = rec.phases[0].seq_len;
  c.train.grad_accum = rec.step_at(0, micro).batch_size / micro;
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  ConfigReader r = ConfigReader::from_string(text, source, overrides);
  RunConfig c;
  c.source = source;
  c.text = text;
  c.overrides = overrides;
  c.model = model::ModelConfig::from_toml(r);
  bool explicit_total = r.has("optim.total_steps");
  const bool explicit_steps = r.has("train.steps"), explicit_seq = r.has("train.seq_len"),
             explicit_accum = r.has("train.grad_accum");
  const bool recipe_section = r.has("recipe");
  c.optim = optim::OptimizerConfig::from_toml(r);
  c.data = read_data(r);
  c.train = read_train(r);
  c.ckpt = read_ckpt(r);
  c.parallel = read_parallel(r);
  c.recipe = optim::Recipe::from_toml(r);
  r.finish();
  need(!recipe_section || c.has_recipe(), source, "recipe.phases", "at least one [[recipe.phases]] table",
       "a [recipe] section without phases");
  // The schedule spans the run unless the config says otherwise.
  if (!explicit_total) c.optim.total_steps = c.train.steps;
  if (c.has_recipe()) check_recipe(c, explicit_steps, explicit_seq, explicit_accum, explicit_total);
  // The run's token count (steps × tokens per step) is an int64 in the trainer, the metrics and
  // the checkpoints: it must not overflow.
  const int64_t per_step_max = INT64_MAX / c.train.seq_len / c.train.micro_batch;
  need(c.train.grad_accum <= per_step_max, source, "train.grad_accum",
       "at most " + std::to_string(per_step_max) + " (tokens per step must fit a 64-bit count)",
       std::to_string(c.train.grad_accum));
  need(c.train.steps <= INT64_MAX / c.tokens_per_step(), source, "train.steps",
       "at most " + std::to_string(INT64_MAX / c.tokens_per_step()) + " (steps x " +
           std::to_string(c.tokens_per_step()) + " tokens per step must fit a 64-bit token count)",
       std::to_string(c.train.steps));
  need(c.train.seq_len <= c.model.max_position_embeddings, source, "train.seq_len",
       "at most model.max_position_embeddings (" + std::to_string(c.model.max_position_embeddings) + ")",
       std::to_string(c.train.seq_len));
  // A short try-out of a config written for a long run (configs/demo.toml --set train.steps=20):
  // when the schedule follows train.steps, a warm-up that (with a WSD decay) does not fit the run
  // is shortened to fit, with a warning, instead of refused. An explicit optim.total_steps is the
  // user's schedule and is checked as written.
  if (!explicit_total && !c.has_recipe()) {
    optim::OptimizerConfig& o = c.optim;
    const int64_t decay = o.schedule == optim::ScheduleKind::wsd
                              ? static_cast<int64_t>(std::llround(o.decay_fraction * static_cast<double>(o.total_steps)))
                              : 0;
    if (o.warmup_steps + decay > o.total_steps) {
      const int64_t fit = std::max<int64_t>(0, o.total_steps - decay);
      log_warn(source, ": optim.warmup_steps = ", o.warmup_steps, " does not fit a run of train.steps = ", o.total_steps,
               decay > 0 ? str(" with its ", decay, "-step decay") : std::string(), "; warming up over ", fit,
               " steps instead");
      o.warmup_steps = fit;
    }
  }
  c.optim.validate(source);
  c.values = r.values();
  c.values["optim.warmup_steps"] = std::to_string(c.optim.warmup_steps);
  c.values["train.steps"] = std::to_string(c.train.steps);
  c.values["train.seq_len"] = std::to_string(c.train.seq_len);
  c.values["train.grad_accum"] = std::to_string(c.train.grad_accum);
  c.values["optim.total_steps"] = std::to_string(c.optim.total_steps);
  for (size_t i = 0; i < c.recipe.phases.size(); ++i) {
    std::ostringstream theta;
    theta.precision(17);
    theta << c.recipe.phases[i].rope_theta;
    c.values["recipe.phases[" + std::to_string(i) + "].rope_theta"] = theta.str();
  }
  return c;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(read_config_file(path), path, overrides);
}

}  // namespace zaya::train
