// Reading TOML run configs strictly: every key a component reads is declared by the reader call,
// and finish() rejects every key nobody read (a typo must never silently fall back to a default).
// `--set section.key=value` overrides are applied before reading and validated the same way.
//
// Usage (each component reads its own section; torchtitan-style one config object):
//   ConfigReader r = ConfigReader::from_file(path, overrides);
//   r.get("model.hidden_size", cfg.hidden_size);   // optional: keeps the default when absent
//   r.require("data.prefix", cfg.prefix);          // required
//   r.finish();                                    // unknown keys -> zaya::Error
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace toml {
inline namespace v3 {
class table;
}
}  // namespace toml

namespace zaya {

class ConfigReader {
 public:
  static ConfigReader from_file(const std::string& path, const std::vector<std::string>& overrides = {});
  static ConfigReader from_string(const std::string& text, const std::string& name,
                                  const std::vector<std::string>& overrides = {});
  ConfigReader(ConfigReader&&) noexcept;
  ConfigReader& operator=(ConfigReader&&) noexcept;
  ~ConfigReader();

  // Optional keys: `out` keeps its value when the key is absent; a present key of the wrong
  // type (or out of range) is an error naming the file, the key, what was expected and found.
  void get(const std::string& key, int64_t& out);
  void get(const std::string& key, int& out);
  void get(const std::string& key, double& out);  // integers are accepted for floats
  void get(const std::string& key, float& out);
  void get(const std::string& key, bool& out);
  void get(const std::string& key, std::string& out);
  void get(const std::string& key, std::vector<double>& out);
  void get(const std::string& key, std::vector<int64_t>& out);
  void get(const std::string& key, std::vector<std::string>& out);

  // Required keys: absent is an error.
  template <class T>
  void require(const std::string& key, T& out) {
    require_present(key);
    get(key, out);
  }

  bool has(const std::string& key) const;
  // Number of tables in an array of tables ([[recipe.phases]]); 0 when absent. Elements are read
  // with keys like "recipe.phases[1].tokens".
  size_t table_count(const std::string& key);

  // Throws on the first key that no get/require touched, suggesting the closest known key.
  void finish() const;
  // Every key a get() read, with the value it produced, in TOML notation: the file's or --set's
  // value, or the caller's default when the key is absent. Two configs that read the same values
  // configure the same thing (a resumed run compares its config with its checkpoint's this way).
  const std::map<std::string, std::string>& values() const { return values_; }
  const std::string& file() const { return file_; }

 private:
  ConfigReader();
  const void* find(const std::string& key) const;  // toml::node*, or nullptr
  void require_present(const std::string& key) const;
  [[noreturn]] void type_error(const std::string& key, const char* expected, const void* node) const;

  std::unique_ptr<toml::table> root_;
  std::string file_;
  std::set<std::string> overridden_;      // keys that came from --set
  mutable std::set<std::string> known_;   // keys asked for, present or not
  std::map<std::string, std::string> values_;  // what each get() produced
};

// Splits "a.b[2].c" into path elements; exposed for tests.
std::vector<std::string> split_config_key(const std::string& key);

// The text of a TOML config file; a zaya::Error names a path that cannot be opened or is a
// directory (an ifstream opens a directory and reads nothing, which would parse as an empty config).
std::string read_config_file(const std::string& path);

}  // namespace zaya
