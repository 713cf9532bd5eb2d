#include <csignal>
#include <iostream>

#include "commands.h"
#include "zaya/aegis/recovery.h"
#include "zaya/aegis/supervisor.h"

namespace zaya::app {
namespace {

std::atomic<int> g_stop_signal{0};
void supervisor_stop_signal(int sig) { g_stop_signal.store(sig); }

void add_supervise(CLI::App& app, Commands& commands) {
  auto o = std::make_shared<aegis::SupervisorOptions>();
  auto run_dir = std::make_shared<std::string>();
  auto hosts = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "supervise",
      "Run a training job under the Aegis supervisor: classify each failure, restart from the newest "
      "checkpoint that verifies, keep an incident log (docs/aegis.md). Usage: zaya supervise [options] -- "
      "<launch command>, e.g. -- mpirun -np 2 zaya train --config run.toml");
  // A later occurrence of an option wins, so wrappers can append overrides.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--run-dir", *run_dir,
                  "the job's train.out_dir (default: read from the command's --config and --set train.out_dir=)");
  cmd->add_option("--hosts", *hosts,
                  "hosts file: 'name slots=N' per line; the command's {hosts} and {np} become the hosts not "
                  "excluded ('a:2,b:2') and their slots");
  cmd->add_option("--max-restarts", o->max_restarts, "restarts after failures before giving up")->capture_default_str();
  cmd->add_option("--backoff", o->backoff_s, "seconds before the first restart, doubled per failure in a row")
      ->capture_default_str();
  cmd->add_option("--backoff-max", o->backoff_max_s, "the longest back-off, seconds")->capture_default_str();
  cmd->add_option("--stop-grace", o->stop_grace_s,
                  "on SIGTERM/SIGINT to the supervisor: seconds the job may take to save and stop")
      ->capture_default_str();
  cmd->add_option("--exclude-after", o->exclude_after, "failures blamed on one host before it is excluded")
      ->capture_default_str();
  cmd->add_flag("--exclude-stragglers", o->exclude_stragglers,
                "with --hosts: restart without a straggler's host (default: report only)");
  cmd->add_option("--hang-timeout", o->monitor.hang_timeout_s,
                  "seconds without heartbeat progress that make a hang (default 0: max(--hang-min, 2 x the median "
                  "step time + 10 s))")
      ->capture_default_str();
  cmd->add_option("--hang-min", o->monitor.hang_min_s, "the learned hang timeout's floor, seconds")->capture_default_str();
  cmd->add_option("--hang-phase-floor", o->monitor.hang_phase_floor_s,
                  "the hang timeout's floor while a rank starts, evaluates or saves a checkpoint, seconds")
      ->capture_default_str();
  cmd->add_option("--startup-timeout", o->monitor.startup_timeout_s,
                  "seconds from the launch to the first heartbeat before it is a hang (0: off, for jobs without "
                  "heartbeats)")
      ->capture_default_str();
  cmd->add_option("--spike-z", o->monitor.spike_z, "a loss above mean + z x std of the window is a spike ...")
      ->capture_default_str();
  cmd->add_option("--spike-ratio", o->monitor.spike_ratio, "... and above this x the mean")->capture_default_str();
  cmd->add_option("--spike-window", o->monitor.spike_window, "steps of the running loss statistic")
      ->capture_default_str();
  cmd->add_option("--spike-min-history", o->monitor.spike_min_history, "steps seen before spikes are judged")
      ->capture_default_str();
  cmd->add_option("--straggler-factor", o->monitor.straggler_factor,
                  "a rank whose step time is >= this x the others' median ...")
      ->capture_default_str();
  cmd->add_option("--straggler-steps", o->monitor.straggler_steps, "... for this many steps in a row is a straggler")
      ->capture_default_str();
  cmd->add_option("--exit-grace", o->exit_grace_s,
                  "seconds a job that reported a fatal error (collective timeout, OOM, 'zaya: error:') may take to "
                  "exit before it is killed")
      ->capture_default_str();
  cmd->add_option("--progress-every", o->progress_every_s, "seconds between progress lines (0: none)")
      ->capture_default_str();
  cmd->add_flag("--quiet-job", [o](int64_t) { o->echo_output = false; },
                "do not copy the job's output to stdout (it is always in <run-dir>/aegis/attempt_N.log)");
  cmd->add_option("command", o->command, "the launch command, after --")->required();
  cmd->positionals_at_end();
  commands.push_back({cmd, [o, run_dir, hosts] {
                        o->run_dir = run_dir->empty() ? aegis::run_dir_of_command(o->command)
                                                      : std::filesystem::path(*run_dir);
                        if (!hosts->empty()) o->hosts_file = *hosts;
                        std::signal(SIGTERM, supervisor_stop_signal);
                        std::signal(SIGINT, supervisor_stop_signal);
                        o->stop_signal = &g_stop_signal;
                        return aegis::supervise(*o);
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(supervise, zaya::app::add_supervise);
