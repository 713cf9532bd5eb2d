// zaya generate: cached autoregressive generation from a ZAYA1 model (--model: a zaya checkpoint or
// a transformers directory; --ckpt is another name for it; --init-config: zaya's own init of a
// TOML config, for timing). With --prompt-ids it prints the new token ids, comma-separated, one
// line per sequence; with --prompt TEXT it encodes with the SentencePiece tokenizer and prints the
// decoded prompt + continuation. --batch N decodes N sequences together (one prompt repeated, or N
// prompts of equal length separated by ';'); --timing prints the prefill and decode rates.
// Sampling lives in the library (zaya/model/generate.h); this file only parses and prints.
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "model_source.h"
#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/data/tokenizer.h"
#include "zaya/model/generate.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/train/model_io.h"

namespace zaya::app {
namespace {

struct GenerateArgs {
  std::string model, prompt_ids, prompt, tokenizer, device = "cpu";
  int64_t max_new = 32;
  std::optional<int64_t> eos;  // none: the model config's eos_token_id
  bool greedy = false, ignore_eos = false;
  double temperature = 0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int64_t batch = 0;  // 0: one sequence per prompt given
  bool timing = false, gemm_shapes = false;
  std::string init_config;
  uint64_t init_seed = 0;
};

std::vector<int32_t> parse_prompt_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string tok;
  while (std::getline(in, tok, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < tok.size() && (tok[used] == ' ' || tok[used] == '\t')) ++used;
    ZAYA_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, "--prompt-ids: '", tok,
               "' is not a token id (expected comma-separated non-negative integers)");
    ids.push_back(static_cast<int32_t>(v));
  }
  ZAYA_CHECK(!ids.empty(), "--prompt-ids: no token ids");
  return ids;
}

// "1,2;3,4" -> {{1, 2}, {3, 4}}: one prompt per sequence, all of one length (the decoder's rows
// share one position).
std::vector<std::vector<int32_t>> parse_prompt_list(const std::string& text) {
  std::vector<std::vector<int32_t>> prompts;
  std::istringstream in(text);
  std::string one;
  while (std::getline(in, one, ';')) prompts.push_back(parse_prompt_ids(one));
  ZAYA_CHECK(!prompts.empty(), "--prompt-ids: no token ids");
  for (size_t i = 1; i < prompts.size(); ++i)
    ZAYA_CHECK(prompts[i].size() == prompts[0].size(), "--prompt-ids: prompt ", i + 1, " has ", prompts[i].size(),
               " tokens and prompt 1 has ", prompts[0].size(), "; batched prompts must have one length");
  return prompts;
}

int run_generate(const GenerateArgs& a) {
  ZAYA_CHECK(a.model.empty() != a.init_config.empty(),
             "generate: give exactly one of --model (a checkpoint or transformers directory) and --init-config");
  ZAYA_CHECK(a.batch >= 0, "--batch must be 1 or more, found ", a.batch);
  ZAYA_CHECK(!a.gemm_shapes || a.timing, "generate: --gemm-shapes is part of --timing's report: add --timing");
  ZAYA_CHECK(a.prompt_ids.empty() != a.prompt.empty(), "generate: give exactly one of --prompt-ids or --prompt");
  ZAYA_CHECK(a.max_new >= 0, "--max-new must be 0 or more, found ", a.max_new);
  ZAYA_CHECK(a.temperature >= 0, "--temperature must be 0 (greedy) or more, found ", a.temperature);
  ZAYA_CHECK(a.top_k >= 0, "--top-k must be 0 (all ids) or more, found ", a.top_k);
  const std::string& source = a.model;
  // Text prompts need the tokenizer the model was trained with: --tokenizer, else the one the
  // checkpoint recorded (found from here, its run directory or where it trained), else a
  // transformers directory's tokenizer.model.
  std::optional<data::Tokenizer> tok;
  std::string tok_path = a.tokenizer;
  if (!a.prompt.empty() && tok_path.empty() && !source.empty()) tok_path = source_tokenizer(source);
  if (!a.prompt.empty()) {
    ZAYA_CHECK(!tok_path.empty(), "generate: --prompt needs a tokenizer, and ", source,
               " has none (no tokenizer recorded in a checkpoint, no tokenizer.model in a transformers "
               "directory); pass --tokenizer MODEL");
    tok = data::Tokenizer::load(tok_path);
  }
  std::vector<std::vector<int32_t>> prompts;
  if (tok) prompts.push_back(tok->encode(a.prompt));
  else prompts = parse_prompt_list(a.prompt_ids);
  const std::vector<int32_t>& prompt = prompts[0];
  ZAYA_CHECK(!prompt.empty(), "generate: the prompt encodes to no tokens");
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  const int64_t given = static_cast<int64_t>(prompts.size());
  ZAYA_CHECK(a.batch == 0 || given == 1 || given == a.batch, "--batch ", a.batch, ": ", given,
             " prompts were given; give one (repeated on every sequence) or --batch of them");
  const int64_t B = a.batch > 0 ? a.batch : given;
  // Loaded for one position: prefill() plans the activations for the prompt once it is checked.
  std::unique_ptr<model::ZayaModel> m;
  const Device device = parse_device_flag(a.device);
  if (!source.empty()) {
    m = train::load_model_source(source, 1, 1, device).model;
  } else {
    ConfigReader reader = ConfigReader::from_file(a.init_config);
    m = std::make_unique<model::ZayaModel>(model::ModelConfig::from_toml(reader), 1, 1, device);
    m->init(a.init_seed);
  }
  const int64_t V = m->config().vocab_size, P = m->config().max_position_embeddings;
  for (const auto& p : prompts)
    for (int32_t id : p)
      ZAYA_CHECK(id < V, "--prompt-ids: token id ", id, " is outside the model's vocabulary [0, ", V, ")");
  // The decode caches are sized by prompt + --max-new: bounded here, before they are allocated.
  ZAYA_CHECK(T0 <= P, "generate: the prompt's ", T0, " tokens exceed the model's max_position_embeddings (", P, ")");
  ZAYA_CHECK(a.max_new <= P - T0, "--max-new ", a.max_new, ": the prompt's ", T0, " tokens + ", a.max_new,
             " new ones exceed the model's max_position_embeddings (", P, "); use --max-new ", P - T0,
             " or less");
  ZAYA_CHECK(!a.eos || (*a.eos >= 0 && *a.eos < V), "--eos: expected a token id in [0, ", V,
             ") (or --ignore-eos to never stop early), found ", a.eos.value_or(0));
  ZAYA_CHECK(!(a.greedy && a.temperature > 0), "generate: give either --greedy or --temperature, not both");
  model::GenerateOptions opt;
  opt.max_new = a.max_new;
  opt.eos_token_id = a.ignore_eos ? -1 : a.eos.value_or(m->config().eos_token_id);
  opt.sampling.greedy = !(a.temperature > 0);  // greedy unless a temperature is given
  opt.sampling.temperature = a.temperature > 0 ? a.temperature : 1.0;
  opt.sampling.top_p = a.top_p;
  opt.sampling.top_k = a.top_k;
  opt.sampling.seed = a.seed;
  ZAYA_CHECK(opt.sampling.top_p > 0 && opt.sampling.top_p <= 1, "--top-p must be in (0, 1], found ", a.top_p);
  std::vector<int32_t> rows;  // [B, T0]
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<size_t>(given == 1 ? 0 : b)];
    rows.insert(rows.end(), p.begin(), p.end());
  }
  Tensor tp = Tensor::borrow(rows.data(), Shape{B, T0}, DType::i32);
  model::GenerateStats stats;
  // The CPU GEMM counters (ops/cpu/gemm_cpu.h) split the decode's time into its GEMMs and the rest.
  ops::cpu::GemmTimeStats gemm_at_prefill;
  stats.after_prefill = [&] {
    gemm_at_prefill = ops::cpu::gemm_time_stats();
    ops::cpu::gemm_profile_shapes(a.gemm_shapes);  // from here on: the decode steps' shapes only
  };
  const auto out = model::generate(*m, tp, opt, &stats);
  const ops::cpu::GemmTimeStats gemm_at_end = ops::cpu::gemm_time_stats();
  for (int64_t b = 0; b < B; ++b) {
    const auto& o = out[static_cast<size_t>(b)];
    if (tok) {  // text in, text out: the prompt followed by its continuation
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), o.begin(), o.end());
      std::printf("%s\n", tok->decode(all).c_str());
      continue;
    }
    std::string line;
    for (size_t i = 0; i < o.size(); ++i) line += (i ? "," : "") + std::to_string(o[i]);
    std::printf("%s\n", line.c_str());
  }
  if (a.timing) {
    // On stderr, so the ids on stdout stay what they are without --timing.
    const double per_step = stats.decode_steps > 0 ? stats.decode_s / static_cast<double>(stats.decode_steps) : 0;
    std::fprintf(stderr,
                 "timing: batch %lld, prompt %lld: prefill %.3f ms (%.1f tokens/s); %lld decode steps %.3f ms "
                 "(%.3f ms per step, %.1f tokens/s)\n",
                 static_cast<long long>(B), static_cast<long long>(T0), 1e3 * stats.prefill_s,
                 stats.prefill_s > 0 ? static_cast<double>(B * T0) / stats.prefill_s : 0.0,
                 static_cast<long long>(stats.decode_steps), 1e3 * stats.decode_s, 1e3 * per_step,
                 per_step > 0 ? static_cast<double>(B) / per_step : 0.0);
    if (m->device() == Device::cpu && stats.decode_steps > 0) {
      const double n = static_cast<double>(stats.decode_steps), g = gemm_at_end.seconds - gemm_at_prefill.seconds;
      const double flops = gemm_at_end.flops - gemm_at_prefill.flops;
      std::fprintf(stderr, "timing: decode GEMMs %.3f ms per step (%.2f GFLOP at %.2f GFLOP/s), everything else %.3f ms\n",
                   1e3 * g / n, 1e-9 * flops / n, g > 0 ? 1e-9 * flops / g : 0.0, 1e3 * (per_step - g / n));
      for (const auto& st : ops::cpu::gemm_shape_times())
        std::fprintf(stderr, "timing:   %-28s %6.1f calls %9.3f ms per step\n", st.shape.c_str(),
                     static_cast<double>(st.calls) / n, 1e3 * st.seconds / n);
    }
  }
  return 0;
}

void add_generate(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate token ids from a ZAYA1 model (cached decode)");
  cmd->add_option(
      "--model,--ckpt", args->model,
      "zaya checkpoint (step dir, or run dir using `latest`) or transformers save_pretrained directory");
  cmd->add_option("--init-config", args->init_config,
                  "instead of --model: a TOML run config ([model]) initialized from --init-seed (for timing)");
  cmd->add_option("--init-seed", args->init_seed, "init seed with --init-config")->capture_default_str();
  cmd->add_option("--batch", args->batch,
                  "sequences decoded together (default: one per prompt); one --prompt-ids prompt is repeated, or "
                  "give N prompts of one length separated by ';'")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--timing", args->timing, "print prefill and decode times and tokens/s on stderr");
  cmd->add_flag("--gemm-shapes", args->gemm_shapes, "with --timing on the CPU: the decode steps' GEMM time per shape");
  cmd->add_option("--prompt-ids", args->prompt_ids, "comma-separated prompt token ids (prints new ids)");
  cmd->add_option("--prompt", args->prompt, "prompt text (prints decoded text; needs the tokenizer)");
  cmd->add_option("--tokenizer", args->tokenizer, "SentencePiece .model (default: the checkpoint's)");
  cmd->add_option("--max-new", args->max_new,
                  "maximum number of new tokens (prompt + new at most the model's max_position_embeddings)")
      ->capture_default_str();
  cmd->add_flag("--greedy", args->greedy, "argmax decoding (the default when no --temperature is given)");
  cmd->add_option("--temperature", args->temperature, "sample from softmax(logits / T); 0 (the default) is greedy");
  cmd->add_option("--top-k", args->top_k, "sample from the K most probable ids only (0: all)")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "nucleus sampling: keep the smallest set of ids with mass >= P")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Philox seed of the sampler")->capture_default_str();
  cmd->add_option("--device", args->device, "cpu or cuda (the KV cache and CCA state live there)")->capture_default_str();
  cmd->add_option("--eos", args->eos, "stop after this id (default: the config's eos_token_id)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "never stop before --max-new tokens");
  commands.push_back({cmd, [args] { return run_generate(*args); }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(generate, zaya::app::add_generate);
