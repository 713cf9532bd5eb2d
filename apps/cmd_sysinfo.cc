#include <iostream>

#include "commands.h"
#include "zaya/bench/sysinfo.h"

namespace zaya::app {
namespace {

void add_sysinfo(CLI::App& app, Commands& commands) {
  auto* cmd = app.add_subcommand("sysinfo", "Print cores, memory, CPU ISA, library versions and CUDA devices");
  commands.push_back({cmd, [] {
                        std::cout << bench::format_sysinfo(bench::query_sysinfo());
                        return 0;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(sysinfo, zaya::app::add_sysinfo);
