// zaya: one binary, subcommands only. Exit codes: 0 success, 1 a check failed (e.g. `ckpt verify`),
// 2 a usage or input error (bad flag, bad config, malformed file), 3 an internal error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>

#include "cli_vocabulary.h"
#include "commands.h"
#include "zaya_build_info.h"  // generated: ZAYA_GIT_COMMIT
#include "zaya/core/build_info.h"
#include "zaya/core/cpu_isa.h"
#include "zaya/core/error.h"
#include "zaya/core/log.h"
#include "zaya/core/threads.h"

// The CPU check runs before every other static initializer of the binary (priority 101 comes
// before the default), so on a CPU that lacks an instruction set of the build the user gets a
// message naming it instead of SIGILL in whichever initializer or kernel first uses it. This file
// and zaya/core/cpu_isa.cc are compiled for baseline x86-64 (CMakeLists.txt) for the same reason.
__attribute__((constructor(101))) static void check_cpu_before_anything_else() { zaya::require_build_isa(); }

namespace {

// "PATH: cannot create directories: Not a directory" from libstdc++'s "filesystem error: cannot
// create directories: Not a directory [PATH]".
std::string describe(const std::filesystem::filesystem_error& e) {
  std::string what = e.what();
  const std::string prefix = "filesystem error: ";
  if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  std::string paths;
  for (const auto* p : {&e.path1(), &e.path2()}) {
    if (p->empty()) continue;
    const std::string tail = " [" + p->string() + "]";
    if (const size_t at = what.rfind(tail); at != std::string::npos) what.erase(at, tail.size());
    paths += (paths.empty() ? "" : " -> ") + p->string();
  }
  return paths.empty() ? what : paths + ": " + what;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zaya: train, survive, characterize and size ZAYA1-style MoE language models"};
  app.require_subcommand(1);
  char build_isa[1024];
  zaya::format_build_isa(build_isa, sizeof build_isa);
  app.set_version_flag("--version",
                       std::string("zaya, built for ") + build_isa + "\nversion     " + zaya::version() +
                           "\ncommit      " + ZAYA_GIT_COMMIT +
                           "\nbuild type  " + ZAYA_BUILD_TYPE + "\ncuda        " + ZAYA_CUDA_DESCRIPTION,
                       "Print the version, commit, build type, CUDA and the instruction sets this binary was built for, and exit");
  int64_t threads = 0;
  std::string log_level = "info";
  auto* threads_opt = app.add_option(
      "--threads", threads,
      "Threads for OpenMP, oneDNN and BLAS, at most 4 x the hardware threads (default: $ZAYA_THREADS, "
      "else the hardware threads / the launcher's ranks on this host)");
  app.add_option("--log-level", log_level, "debug, info, warn or error");
  // Global options anywhere: a subcommand hands an option it does not know to its parent, so
  // `zaya eval --threads 1 ...` works as `zaya --threads 1 eval ...`. Set before the subcommands
  // are added, which inherit it (nested ones too: `zaya bench step --threads 1`).
  app.fallthrough();

  zaya::set_build_commit(ZAYA_GIT_COMMIT);  // into every checkpoint's manifest
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
    // A mistyped command gets the nearest real one instead of CLI11's "A subcommand is required".
    if (const std::string msg = zaya::app::unknown_subcommand_message(app, argc, argv); !msg.empty()) {
      std::cerr << "zaya: error: " << msg << "\n";
      return 2;
    }
    // Every bad flag reads like zaya's other errors (CLI11's own validators included).
    std::cerr << "zaya: error: " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  }
  try {
    zaya::set_log_level(zaya::parse_log_level(log_level));
    // Checked before any runtime sees it: libgomp crashes on absurd counts instead of failing.
    const int num_threads = threads_opt->count() ? zaya::checked_num_threads(threads, "--threads")
                                                 : zaya::default_num_threads();
    // Ranks sharing a host whose threads outnumber its cores must not spin-wait in OpenMP; libgomp
    // took its wait policy from the environment before main, so this may restart the program with
    // OMP_WAIT_POLICY=PASSIVE (before MPI, CUDA or any thread has started).
    zaya::restart_with_passive_openmp_if_oversubscribed(num_threads, argv);
    zaya::set_num_threads(num_threads);
    for (const auto& c : commands)
      if (c.cli->parsed()) return c.run();
    return 2;  // unreachable: require_subcommand(1)
  } catch (const zaya::Error& e) {
    std::cerr << "zaya: error: " << e.what() << "\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be used (not a directory, no permission, disk full): a
    // usage error, named by path and reason rather than as an internal one.
    std::cerr << "zaya: error: " << describe(e) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "zaya: internal error: " << e.what() << "\n";
    return 3;
  }
}
