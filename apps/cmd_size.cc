#include <filesystem>
#include <iostream>
#include <optional>

#include "commands.h"
#include "zaya/core/config.h"
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
  cmd->add_flag("--suggest", args->suggest, "also rank nearby shapes at the same parameter budget by predicted step time");
  cmd->add_option("--budget", args->budget, "what --suggest holds fixed (±5%): total or active parameters")
      ->capture_default_str();
  cmd->add_option("--suggest-count", args->suggest_count, "how many suggestions to print")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
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
                        std::cout << sizing::format_size_report(sizing::size_model(c, args->run, hw));
                        if (args->suggest) {
                          if (!hw) {
                            // Ranking needs a step-time model: say which profile stands in.
                            hw = sizing::builtin_profile("h100");
                            std::cout << "note           --suggest without --hw ranks on the h100 profile\n";
                          }
                          std::cout << sizing::format_suggestions(sizing::suggest_shapes(c, args->run, *hw, so), so);
                        }
                        return 0;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(size, zaya::app::add_size);
