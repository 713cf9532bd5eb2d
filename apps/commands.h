// Each subcommand lives in its own apps/cmd_<name>.cc and registers itself with a static
// ZAYA_COMMAND(name, function) line; main() parses, applies the global options, then runs the one
// command chosen. A Command is the parsed CLI11 node plus the function that runs it (returning
// the exit code). No logic lives here: commands call into the libraries.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace zaya::app {

struct Command {
  CLI::App* cli = nullptr;
  std::function<int()> run;
};
using Commands = std::vector<Command>;
using Registrar = void (*)(CLI::App& app, Commands& commands);

struct RegisteredCommand {
  std::string name;
  Registrar add;
};
std::vector<RegisteredCommand>& command_registry();

struct RegisterCommand {
  RegisterCommand(const char* name, Registrar add) { command_registry().push_back({name, add}); }
};

// `zaya bench step` (apps/cmd_bench_step.cc), added under the `bench` command by apps/cmd_bench.cc.
void add_bench_step(CLI::App& bench, Commands& commands);

// Subcommands whose implementation has not landed yet: they say so and exit 2. Names already
// registered are skipped.
void add_pending_commands(CLI::App& app, Commands& commands);

}  // namespace zaya::app

#define ZAYA_COMMAND(name, fn) \
  static ::zaya::app::RegisterCommand zaya_register_##name(#name, fn)
