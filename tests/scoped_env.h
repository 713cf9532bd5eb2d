// For tests of code that reads the launcher's environment: clears a list of variables for the life
// of one object, sets the given ones, and puts every old value back when it goes away.
#pragma once

#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <string>

namespace zaya::test {

class ScopedEnv {
 public:
  ScopedEnv(std::span<const char* const> cleared, const std::map<std::string, std::string>& vars) {
    for (const char* v : cleared) save(v);
    for (const auto& [k, v] : vars) {
      save(k);
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void save(const std::string& name) {
    if (saved_.count(name)) return;
    const char* old = std::getenv(name.c_str());
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    unsetenv(name.c_str());
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace zaya::test
