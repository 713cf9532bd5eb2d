// Helpers shared by test files of every layer (tests/ is on each test binary's include path).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <functional>
#include <string>

#include "zaya/core/error.h"

namespace zaya::test {

// The message of the zaya::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct CliRun {
  int code;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line and captures its output; code is the exit status, 128 + the signal
// for a process killed by one, -1 when it could not start.
inline CliRun run_shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "cannot start: " + cmd};
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// Runs the built zaya binary with `args` (a shell word list) and captures its output.
inline CliRun run_zaya(const std::string& args) { return run_shell(std::string(ZAYA_BINARY) + " " + args); }

}  // namespace zaya::test
