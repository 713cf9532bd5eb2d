#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>

#include "commands.h"
#include "zaya/sizing/hardware.h"
#include "zaya/train/trainer.h"

namespace zaya::app {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  bool rewind = false;
  int test_pause_commit_ms = 0;
  bool allow_config_change = false;
  std::vector<std::string> inject;
  std::vector<std::string> skip_samples;
  std::string mfu_peak;
};

// --mfu-peak as config overrides: a FLOP/s figure per rank, a hardware profile .json (`zaya bench
// gemm --out`; its name and peak_bf16_flops), or a name train.mfu_peak takes ("cpu", "h100", ...).
std::vector<std::string> mfu_peak_overrides(const std::string& arg) {
  char* end = nullptr;
  const double flops = std::strtod(arg.c_str(), &end);
  if (!arg.empty() && end && *end == '\0') {
    if (!(flops > 0))
      throw Error("invalid MFU peak", {.field = "--mfu-peak", .expected = "a FLOP/s figure > 0, a profile .json or a name",
                                       .found = arg});
    return {"train.mfu_peak_flops=" + arg};
  }
  auto toml_string = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  if (arg.find('/') != std::string::npos || arg.ends_with(".json")) {
    const sizing::HardwareProfile p = sizing::load_profile(arg);
    char figure[64];
    std::snprintf(figure, sizeof figure, "%.17g", p.peak_bf16_flops);
    return {"train.mfu_peak=" + toml_string(p.name), std::string("train.mfu_peak_flops=") + figure};
  }
  return {"train.mfu_peak=" + toml_string(arg)};
}

// Exit codes a supervisor acts on (docs/aegis.md, "Trainer side"): 3 a collective timed out, 4 the
// run stopped on non-finite gradients, 5 a checkpoint save failed, 1 any other failure that is not
// bad input; a zaya::Error of bad input or configuration goes on to main (2).
int train_exit_code(const std::function<int()>& train) {
  try {
    return train();
  } catch (const dist::CollectiveTimeout& e) {
    std::cerr << "zaya: error: " << e.what() << "\n";
    return 3;
  } catch (const train::NonFiniteStop& e) {
    std::cerr << "zaya: error: " << e.what() << "\n";
    return 4;
  } catch (const train::CheckpointSaveFailed& e) {
    std::cerr << "zaya: error: " << e.what() << "\n";
    return 5;
  } catch (const Error&) {
    throw;
  } catch (const std::filesystem::filesystem_error&) {
    throw;
  } catch (const std::exception& e) {
    std::cerr << "zaya: internal error: " << e.what() << "\n";
    return 1;
  }
}

int run_train(const TrainArgs& args, const CLI::App& cmd) {
  std::vector<std::string> overrides = args.overrides;
  if (!args.mfu_peak.empty())
    for (std::string& o : mfu_peak_overrides(args.mfu_peak)) overrides.push_back(std::move(o));
  train::RunConfig cfg = train::load_run_config(args.config, overrides);
  static std::atomic<bool> stop{false};
  train::install_stop_handlers(&stop);
  train::TrainOptions opts;
  if (cmd.count("--resume")) opts.resume = args.resume.empty() ? "latest" : args.resume;
  if (args.rewind && opts.resume.empty())
    throw Error("--rewind goes with --resume STEP_DIR: it moves the checkpoints newer than "
                "STEP_DIR aside and continues from STEP_DIR");
  opts.rewind = args.rewind;
  opts.stop = &stop;
  opts.test_pause_before_commit_ms = args.test_pause_commit_ms;
  opts.allow_config_change = args.allow_config_change;
  opts.inject = args.inject;
  opts.skip_samples = args.skip_samples;
  std::unique_ptr<train::Trainer> trainer;
  train::TrainResult r;
  try {
    trainer = std::make_unique<train::Trainer>(std::move(cfg), opts);
    r = trainer->run();
  } catch (const dist::CollectiveTimeout& e) {
    // A rank is dead or hung. Unwinding would wait for it twice over: a checkpoint commit in flight
    // waits up to its gather timeout (600 s) for that rank's part, and MPI's finalize may wait
    // forever. The heartbeat already says "failed"; the run lock goes with the process.
    std::cerr << "zaya: error: " << e.what() << "\n";
    std::fflush(nullptr);
    std::_Exit(3);
  }
  if (r.nothing_to_do) std::cerr << "zaya train: nothing to do: the run finished at step " << r.last_step << "\n";
  if (r.interrupted) std::cerr << "zaya train: stopped at step " << r.last_step << "; resume with --resume\n";
  return 0;
}

void add_train(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a ZAYA1 model from a TOML run config");
  cmd->add_option("--config", args->config, "run config (TOML), e.g. configs/demo.toml")->required();
  cmd->add_option("--set", args->overrides, "override a config key: --set train.steps=100 (repeatable)");
  cmd->add_option("--resume", args->resume, "resume from 'latest' (under train.out_dir) or a checkpoint directory")
      ->expected(0, 1)
      ->default_str("latest");
  cmd->add_flag("--allow-config-change", args->allow_config_change,
                "with --resume: accept a run config that changes settings the checkpoint was trained with "
                "(data, batch, schedule, ...); the run then leaves the checkpoint's trajectory");
  cmd->add_flag("--rewind", args->rewind,
                "with --resume STEP_DIR: move the run's newer checkpoints aside into out_dir/rewound-<time>/ "
                "and continue from STEP_DIR");
  cmd->add_option("--inject", args->inject,
                  "fault injection (repeatable): kill@step=S[,rank=R], hang@step=S, nan@step=S, "
                  "slow@rank=R,factor=F[,step=S], corrupt-ckpt@step=S, kill-during-save@step=S, exit@step=S,code=C; "
                  "on a supervisor's first attempt only unless ,every-attempt=1 or ,attempt=N (docs/aegis.md)");
  cmd->add_option("--mfu-peak", args->mfu_peak,
                  "the peak MFU divides by: a FLOP/s figure per rank, a hardware profile .json (zaya bench gemm "
                  "--out), or a name: cpu (cores x clock x FLOPs/cycle), a100, h100, h100-pcie, h200, mi300x "
                  "(train.mfu_peak; default auto: this GPU's datasheet peak or the CPU formula)");
  cmd->add_option("--skip-samples", args->skip_samples,
                  "never train on global samples [A, B) (A:B, repeatable); kept in the checkpoints");
  // Test hook (hidden): hold each checkpoint commit this long, so a test can kill mid-save.
  cmd->add_option("--test-pause-commit-ms", args->test_pause_commit_ms)->group("");
  commands.push_back({cmd, [args, cmd] { return train_exit_code([&] { return run_train(*args, *cmd); }); }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(train, zaya::app::add_train);
