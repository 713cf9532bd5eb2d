#include "zaya/train/run_config.h"

#include <fstream>
#include <sstream>

#include "zaya/core/config.h"
#include "zaya/core/error.h"

namespace zaya::train {
namespace {

void need(bool ok, const std::string& source, const std::string& key, const std::string& expected,
          const std::string& found) {
  if (!ok) throw Error("invalid run config", {.file = source, .field = key, .expected = expected, .found = found});
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
  need(!prefixes.empty(), r.file(), "data.train", "a list of dataset prefixes (from `zaya data prepare`)", "nothing");
  need(weights.empty() || weights.size() == prefixes.size(), r.file(), "data.weights",
       "one weight per data.train entry (" + std::to_string(prefixes.size()) + ")", std::to_string(weights.size()));
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
  need(t.steps > 0, r.file(), "train.steps", "> 0", std::to_string(t.steps));
  need(t.micro_batch > 0, r.file(), "train.micro_batch", "> 0", std::to_string(t.micro_batch));
  need(t.seq_len > 0, r.file(), "train.seq_len", "> 0", std::to_string(t.seq_len));
  need(t.grad_accum > 0, r.file(), "train.grad_accum", "> 0", std::to_string(t.grad_accum));
  need(t.log_every > 0, r.file(), "train.log_every", "> 0", std::to_string(t.log_every));
  need(t.eval_every >= 0, r.file(), "train.eval_every", ">= 0", std::to_string(t.eval_every));
  need(t.eval_samples > 0, r.file(), "train.eval_samples", "> 0", std::to_string(t.eval_samples));
  need(!t.out_dir.empty(), r.file(), "train.out_dir", "a directory", "\"\"");
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
  c.optim = optim::OptimizerConfig::from_toml(r);
  c.data = read_data(r);
  c.train = read_train(r);
  c.ckpt = read_ckpt(r);
  r.finish();
  // The schedule spans the run unless the config says otherwise.
  if (!explicit_total) c.optim.total_steps = c.train.steps;
  need(c.train.seq_len <= c.model.max_position_embeddings, source, "train.seq_len",
       "at most model.max_position_embeddings (" + std::to_string(c.model.max_position_embeddings) + ")",
       std::to_string(c.train.seq_len));
  c.optim.validate(source);
  return c;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open config file", {.file = path});
  std::ostringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), path, overrides);
}

}  // namespace zaya::train
