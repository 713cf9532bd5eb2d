#include <filesystem>
#include <iostream>
#include <optional>

#include "commands.h"
#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include <fstream>

#include "zaya/sizing/decode_roofline.h"
#include "zaya/sizing/expert_sweep.h"
#include "zaya/sizing/size_report.h"
#include "zaya/sizing/suggest.h"

namespace zaya::app {
namespace {

struct SizeArgs {
  std::string model;
  std::string hw;
  sizing::RunShape run;
  std::vector<std::string> overrides;
  bool suggest = false;
  std::string budget = "total";
  int suggest_count = 10;
  // Serving (decode_roofline.h): prompt and context default to --seq.
  int64_t prompt = 0, context = 0;
  std::vector<int64_t> decode_batches{1, 8, 64, 256};
  sizing::ServeOptions serve;
  double decode_weight = 0;
  int64_t objective_batch = 1;
  bool sweep_experts = false;
  std::vector<int64_t> sweep_batches{1, 64};
  std::string sweep_json;
  double measured_step_s = 0;
};

void add_size(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<SizeArgs>();
  auto* cmd = app.add_subcommand("size", "Parameters, FLOPs, memory, step time and sizing-rule checks of a model");
  cmd->add_option("--model", args->model, "TOML run config ([model] section), a transformers config.json or its directory (native or legacy ZAYA1 layout)")->required();
  cmd->add_option("--hw", args->hw, "hardware profile: mi300x, h100, h200 or a profile .json");
  cmd->add_option("--dp", args->run.dp, "data-parallel ranks")->check(CLI::PositiveNumber);
  cmd->add_option("--mbs", args->run.mbs, "micro-batch size (sequences per rank)")->check(CLI::PositiveNumber);
  cmd->add_option("--seq", args->run.seq, "sequence length")->check(CLI::PositiveNumber);
  cmd->add_option("--zero", args->run.zero, "ZeRO stage (0 or 1)")->check(CLI::Range(0, 1));
  cmd->add_flag("--recompute", args->run.recompute,
                "activation recomputation (train.recompute): activations of the layer inputs + one layer, and the "
                "time of L - 1 more layer forwards");
  cmd->add_option("--set", args->overrides, "override a config key: model.hidden_size=1024");
  cmd->add_option("--measured-step-s", args->measured_step_s,
                  "a measured step of this shape in seconds (`zaya bench step`'s step time for --mbs x --seq tokens): "
                  "printed next to the --hw profile's prediction, with the ratio and both MFUs");
  cmd->add_flag("--suggest", args->suggest, "also rank nearby shapes at the same parameter budget by predicted step time");
  cmd->add_option("--budget", args->budget, "what --suggest holds fixed (±5%): total or active parameters")
      ->capture_default_str();
  cmd->add_option("--suggest-count", args->suggest_count, "how many suggestions to print")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prompt", args->prompt, "prefill: prompt length (default --seq)")->check(CLI::PositiveNumber);
  cmd->add_option("--context", args->context, "decode: positions each sequence attends over (default --seq)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--decode-batches", args->decode_batches, "decode: batch sizes to price, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--weight-bytes", args->serve.weight_bytes, "serving: bytes per weight element (bf16 2; CPU decoder 4)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_option("--cache-bytes", args->serve.cache_bytes, "serving: bytes per KV-cache element (bf16 2; CPU decoder 4)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_option("--decode-weight", args->decode_weight,
                  "--suggest's joint objective: weight of decode latency (at --objective-batch) against training step "
                  "time, in [0, 1]; 0 ranks by step time alone")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--objective-batch", args->objective_batch, "decode batch of the joint objective")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--sweep-experts", args->sweep_experts,
                "the MoE-width trade-off: fine-grained (fixed active and total), expert count (fixed active) and "
                "coarse (fixed total) expert shapes with training step time, decode latency and memory");
  cmd->add_option("--sweep-batches", args->sweep_batches, "decode batches of --sweep-experts, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--sweep-json", args->sweep_json, "also write --sweep-experts' rows as JSON (tools/plot_expert_sweep.py)");
  commands.push_back({cmd, [args] {
                        model::ModelConfig c;
                        std::error_code ec;
                        if (std::filesystem::is_directory(args->model, ec)) {
                          // A transformers directory (native or legacy ZAYA1 layout): its config.json.
                          c = model::ModelConfig::from_hf_json((std::filesystem::path(args->model) / "config.json").string());
                        } else if (args->model.size() > 5 && args->model.substr(args->model.size() - 5) == ".json") {
                          c = model::ModelConfig::from_hf_json(args->model);
                        } else {
                          ConfigReader r = ConfigReader::from_file(args->model, args->overrides);
                          c = model::ModelConfig::from_toml(r);
                          // Other sections (train, data, ...) belong to other commands: only [model] is checked here.
                        }
                        std::optional<sizing::HardwareProfile> hw;
                        if (!args->hw.empty()) hw = sizing::resolve_profile(args->hw);
                        sizing::SuggestOptions so;
                        so.budget = sizing::parse_budget(args->budget, "--budget");  // checked before any output
                        so.max_results = args->suggest_count;
                        so.decode_weight = args->decode_weight;
                        so.decode_batch = args->objective_batch;
                        so.decode_context = args->context;
                        so.serve = args->serve;
                        ZAYA_CHECK(args->sweep_json.empty() || args->sweep_experts,
                                   "--sweep-json writes --sweep-experts' rows: add --sweep-experts");
                        ZAYA_CHECK(args->measured_step_s == 0 || hw,
                                   "--measured-step-s: a measured step is compared with a hardware profile's "
                                   "prediction; add --hw (h100, h200, mi300x or a profile .json)");
                        const sizing::SizeReport report = sizing::size_model(c, args->run, hw);
                        std::cout << sizing::format_size_report(report);
                        if (args->measured_step_s != 0) std::cout << sizing::format_measured_step(report, args->measured_step_s);
                        const int64_t prompt = args->prompt > 0 ? args->prompt : args->run.seq;
                        const int64_t context = args->context > 0 ? args->context : args->run.seq;
                        std::cout << sizing::format_serve_report(sizing::serve_model(
                            c, prompt, context, args->decode_batches, hw ? &*hw : nullptr, args->serve));
                        if (args->suggest) {
                          if (!hw) {
                            // Ranking needs a step-time model: say which profile stands in.
                            hw = sizing::builtin_profile("h100");
                            std::cout << "note           --suggest without --hw ranks on the h100 profile\n";
                          }
                          std::cout << sizing::format_suggestions(sizing::suggest_shapes(c, args->run, *hw, so), so);
                        }
                        if (args->sweep_experts) {
                          if (!hw) {
                            hw = sizing::builtin_profile("h100");
                            std::cout << "note           --sweep-experts without --hw uses the h100 profile\n";
                          }
                          sizing::ExpertSweepOptions eo;
                          eo.decode_batches = args->sweep_batches;
                          eo.context = args->context;
                          eo.serve = args->serve;
                          const auto rows = sizing::sweep_experts(c, args->run, *hw, eo);
                          std::cout << sizing::format_expert_sweep(rows, *hw, eo);
                          if (!args->sweep_json.empty()) {
                            std::ofstream out(args->sweep_json);
                            out << sizing::expert_sweep_json(rows, *hw, eo);
                            if (!out) throw Error("cannot write the sweep", {.file = args->sweep_json});
                          }
                        }
                        return 0;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(size, zaya::app::add_size);
