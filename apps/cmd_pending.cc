#include <iostream>
#include <string>
#include <vector>

#include "commands.h"

namespace zaya::app {
namespace {

struct Pending {
  const char* name;
  const char* description;
  const char* issue;
};

// Commands that registered for real (apps/cmd_<name>.cc) are skipped; remove their entry here.
const std::vector<Pending> kPending = {
};

}  // namespace

std::vector<RegisteredCommand>& command_registry() {
  static std::vector<RegisteredCommand> registry;
  return registry;
}

void add_pending_commands(CLI::App& app, Commands& commands) {
  for (const Pending& p : kPending) {
    bool landed = false;
    for (const auto& r : command_registry()) landed |= r.name == p.name;
    if (landed) continue;
    auto* cmd = app.add_subcommand(p.name, std::string(p.description) + " (not built yet)");
    cmd->allow_extras();
    commands.push_back({cmd, [p] {
                          std::cerr << "zaya " << p.name << ": not built yet (tracked in issue " << p.issue << ")\n";
                          return 2;
                        }});
  }
}

}  // namespace zaya::app
