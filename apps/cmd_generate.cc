// zaya generate: cached autoregressive generation from a ZAYA1 model (--model: a zaya checkpoint or
// a transformers directory; --ckpt is another name for it). With --prompt-ids
// it prints the new token ids, comma-separated on one line; with --prompt TEXT it encodes with the
// SentencePiece tokenizer and prints the decoded prompt + continuation.
// Sampling lives in the library (zaya/model/generate.h); this file only parses and prints.
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "model_source.h"
#include "zaya/core/error.h"
#include "zaya/data/tokenizer.h"
#include "zaya/model/generate.h"
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

int run_generate(const GenerateArgs& a) {
  ZAYA_CHECK(!a.model.empty(), "generate: --model is required (a checkpoint or transformers directory)");
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
  if (!a.prompt.empty() && tok_path.empty()) tok_path = source_tokenizer(source);
  if (!a.prompt.empty()) {
    ZAYA_CHECK(!tok_path.empty(), "generate: --prompt needs a tokenizer, and ", source,
               " has none (no tokenizer recorded in a checkpoint, no tokenizer.model in a transformers "
               "directory); pass --tokenizer MODEL");
    tok = data::Tokenizer::load(tok_path);
  }
  const std::vector<int32_t> prompt = tok ? tok->encode(a.prompt) : parse_prompt_ids(a.prompt_ids);
  ZAYA_CHECK(!prompt.empty(), "generate: the prompt encodes to no tokens");
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  // Loaded for one position: prefill() plans the activations for the prompt once it is checked.
  std::unique_ptr<model::ZayaModel> m = train::load_model_source(source, 1, 1, parse_device_flag(a.device)).model;
  const int64_t V = m->config().vocab_size, P = m->config().max_position_embeddings;
  for (int32_t id : prompt)
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
  Tensor tp = Tensor::borrow(const_cast<int32_t*>(prompt.data()), Shape{1, T0}, DType::i32);
  const auto out = model::generate(*m, tp, opt);
  if (tok) {  // text in, text out: the prompt followed by its continuation
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), out[0].begin(), out[0].end());
    std::printf("%s\n", tok->decode(all).c_str());
    return 0;
  }
  std::string line;
  for (size_t i = 0; i < out[0].size(); ++i) line += (i ? "," : "") + std::to_string(out[0][i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

void add_generate(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate token ids from a ZAYA1 model (cached decode)");
  cmd->add_option(
      "--model,--ckpt", args->model,
      "zaya checkpoint (step dir, or run dir using `latest`) or transformers save_pretrained directory")
      ->required();
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
