// zaya eval: validation loss and perplexity of a checkpoint (or transformers directory) on a
// Megatron-format dataset prefix.
#include <cstdio>
#include <optional>

#include "commands.h"
#include "model_source.h"
#include "zaya/core/log.h"
#include "zaya/core/task_progress.h"
#include "zaya/data/loader.h"
#include "zaya/data/token_range.h"
#include "zaya/train/batch.h"
#include "zaya/train/model_io.h"

namespace zaya::app {
namespace {

struct EvalArgs {
  std::string ckpt, data, device = "cpu";
  int64_t samples = 64, batch = 8, seq = 0;
  uint64_t seed = 1235;
  bool progress = true;
};

int run_eval(const EvalArgs& a) {
  // Sequence length: the one the checkpoint trained at, unless given.
  int64_t seq = a.seq;
  if (seq <= 0) {
    seq = train::source_state(a.ckpt).value("seq_len", int64_t{0});
    ZAYA_CHECK(seq > 0, a.ckpt, ": the checkpoint does not record its sequence length; pass --seq");
  }
  train::LoadedModel m =
      load_model_checked(a.ckpt, a.batch, seq, a.seq > 0 ? "--seq" : "eval: the checkpoint's seq_len",
                         parse_device_flag(a.device));
  // Every token id is checked against the model's vocabulary before the first forward, so bad data
  // is named by file and sequence instead of failing inside a batch.
  data::check_token_range(a.data, m.model->config().vocab_size);
  data::DataLoader loader({{a.data, 1.0}}, seq, a.seed);
  const int64_t available = loader.samples_per_epoch(0);
  ZAYA_CHECK(available > 0, a.data, ": too few tokens for one sample of ", seq + 1, " tokens");
  int64_t samples = a.samples;
  if (samples > available) {  // more would repeat sequences: the mean would weight them twice
    log_warn("eval: --samples ", samples, " is more than the ", available, " sequences of ", seq, " tokens in ", a.data,
             "; evaluating each of them once");
    samples = available;
  }
  // Said before the forwards start, so a long evaluation is not silent until it ends.
  log_info("eval: ", samples, " sequences of ", seq, " tokens from ", a.data, " in batches of ", a.batch);
  train::EvalResult r;
  {
    std::optional<TaskProgress> progress;  // made at the first batch, which knows the total
    r = train::evaluate(*m.model, loader, samples, nullptr, nullptr, [&](int64_t done, int64_t total) {
      if (!progress) progress.emplace("eval", total, "batches", a.progress);
      progress->update(done);
    });
  }
  std::printf("checkpoint  %s\ndata        %s\ntokens      %lld (%lld sequences of %lld)\nloss        %.4f nats/token\nperplexity  %.2f\n",
              m.source.string().c_str(), a.data.c_str(), static_cast<long long>(r.tokens),
              static_cast<long long>(r.tokens / seq), static_cast<long long>(seq), r.loss, r.perplexity);
  return 0;
}

void add_eval(CLI::App& app, Commands& commands) {
  auto a = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint on a dataset");
  cmd->add_option("--model,--ckpt", a->ckpt, "checkpoint (step dir or run dir) or transformers directory")->required();
  cmd->add_option("--data", a->data, "dataset prefix (PREFIX.bin/.idx), e.g. data/pydocs_val")->required();
  cmd->add_option("--samples", a->samples, "sequences to evaluate")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--batch", a->batch, "sequences per forward")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seq", a->seq, "sequence length (default: the checkpoint's training length)");
  cmd->add_option("--seed", a->seed, "sample-order seed")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_flag("!--no-progress", a->progress,
                "no progress on stderr (otherwise a line redrawn on a terminal, else a log line per tenth)");
  commands.push_back({cmd, [a] { return run_eval(*a); }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(eval, zaya::app::add_eval);
