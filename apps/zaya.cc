// zaya: one binary, subcommands only. Exit codes: 0 success, 1 a check failed (e.g. `ckpt verify`),
// 2 a usage or input error (bad flag, bad config, malformed file), 3 an internal error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>

#include "commands.h"
#include "zaya/core/error.h"
#include "zaya/core/log.h"
#include "zaya/core/threads.h"

int main(int argc, char** argv) {
  CLI::App app{"zaya: train, survive, characterize and size ZAYA1-style MoE language models"};
  app.require_subcommand(1);
  int threads = 0;
  std::string log_level = "info";
  app.add_option("--threads", threads, "Threads for OpenMP, oneDNN and BLAS (default: $ZAYA_THREADS or all)");
  app.add_option("--log-level", log_level, "debug, info, warn or error");

  zaya::app::Commands commands;
  auto registry = zaya::app::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& r : registry) r.add(app, commands);
  zaya::app::add_pending_commands(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    zaya::set_log_level(zaya::parse_log_level(log_level));
    zaya::set_num_threads(threads);
    for (const auto& c : commands)
      if (c.cli->parsed()) return c.run();
    return 2;  // unreachable: require_subcommand(1)
  } catch (const zaya::Error& e) {
    std::cerr << "zaya: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "zaya: internal error: " << e.what() << "\n";
    return 3;
  }
}
