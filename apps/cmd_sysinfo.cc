#include <iostream>

#include "commands.h"
#include "zaya/bench/sysinfo.h"

namespace zaya::app {

void add_sysinfo_command(CLI::App& app, Commands& commands) {
  auto* cmd = app.add_subcommand("sysinfo", "Print cores, memory, CPU ISA, library versions and CUDA devices");
  commands.push_back({cmd, [] {
                        std::cout << bench::format_sysinfo(bench::query_sysinfo());
                        return 0;
                      }});
}

}  // namespace zaya::app
