#include <iostream>

#include "commands.h"
#include "zaya/bench/sysinfo.h"
#include "zaya/core/cpu_isa.h"

namespace zaya::app {
namespace {

void add_sysinfo(CLI::App& app, Commands& commands) {
  auto* cmd = app.add_subcommand("sysinfo", "Print cores, memory, CPU ISA, library versions and CUDA devices");
  commands.push_back({cmd, [] {
                        std::cout << bench::format_sysinfo(bench::query_sysinfo());
                        char build_isa[1024];
                        format_build_isa(build_isa, sizeof build_isa);
                        std::cout << "build isa      " << build_isa << "\n";
                        return 0;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(sysinfo, zaya::app::add_sysinfo);
