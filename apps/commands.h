// Each subcommand registers itself on the CLI from its own file in apps/ and returns a Command:
// the parsed CLI11 node and the function that runs it (returning the exit code). main() parses,
// applies the global options, then runs the one command that was chosen. No logic lives here:
// commands call into the libraries.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace zaya::app {

struct Command {
  CLI::App* cli = nullptr;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

void add_sysinfo_command(CLI::App& app, Commands& commands);
// Subcommands whose implementation has not landed yet: they say so and exit 2.
void add_pending_commands(CLI::App& app, Commands& commands);

}  // namespace zaya::app
