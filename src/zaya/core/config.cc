#include "zaya/core/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "zaya/core/error.h"

namespace zaya {
namespace {

std::string describe(const toml::node* n) {
  if (!n) return "nothing";
  std::ostringstream out;
  switch (n->type()) {
    case toml::node_type::string: out << "string \"" << n->value<std::string>().value_or("") << "\""; break;
    case toml::node_type::integer: out << "integer " << n->value<int64_t>().value_or(0); break;
    case toml::node_type::floating_point: out << "float " << n->value<double>().value_or(0); break;
    case toml::node_type::boolean: out << "boolean " << (n->value<bool>().value_or(false) ? "true" : "false"); break;
    case toml::node_type::array: out << "an array"; break;
    case toml::node_type::table: out << "a table"; break;
    default: out << "a date/time"; break;
  }
  return out.str();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Parses the value text of a --set override as TOML; text that is not a TOML value is a string.
toml::table parse_override_value(const std::string& text) {
  try {
    return toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    toml::table t;
    t.insert_or_assign("v", text);
    return t;
  }
}

void apply_override(toml::table& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("malformed override", {.field = "--set", .expected = "section.key=value", .found = assignment});
  std::string key = assignment.substr(0, eq);
  std::vector<std::string> path = split_config_key(key);
  toml::table* t = &root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    toml::node* child = t->get(path[i]);
    if (!child) {
      t->insert_or_assign(path[i], toml::table{});
      child = t->get(path[i]);
    }
    if (!child->is_table())
      throw Error("cannot override inside a non-table", {.field = key, .expected = "a table at " + path[i], .found = describe(child)});
    t = child->as_table();
  }
  toml::table parsed = parse_override_value(assignment.substr(eq + 1));
  t->insert_or_assign(path.back(), *parsed.get("v"));
}

void collect_leaves(const toml::node& n, const std::string& prefix, std::vector<std::string>& out) {
  if (auto* t = n.as_table()) {
    for (auto&& [k, v] : *t) collect_leaves(v, prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str()), out);
  } else if (auto* a = n.as_array(); a && a->is_array_of_tables()) {
    for (size_t i = 0; i < a->size(); ++i) collect_leaves(*a->get(i), prefix + "[" + std::to_string(i) + "]", out);
  } else {
    out.push_back(prefix);
  }
}

std::string strip_indices(const std::string& key) {
  std::string out;
  bool skip = false;
  for (char c : key) {
    if (c == '[') skip = true;
    if (!skip) out += c;
    if (c == ']') { skip = false; out += "[]"; }
  }
  return out;
}

}  // namespace

std::vector<std::string> split_config_key(const std::string& key) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : key) {
    if (c == '.') {
      if (cur.empty()) throw Error("empty path element in config key", {.field = key});
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (cur.empty()) throw Error("empty path element in config key", {.field = key});
  parts.push_back(cur);
  return parts;
}

ConfigReader::ConfigReader() : root_(std::make_unique<toml::table>()) {}
ConfigReader::ConfigReader(ConfigReader&&) noexcept = default;
ConfigReader& ConfigReader::operator=(ConfigReader&&) noexcept = default;
ConfigReader::~ConfigReader() = default;

ConfigReader ConfigReader::from_string(const std::string& text, const std::string& name,
                                       const std::vector<std::string>& overrides) {
  ConfigReader r;
  r.file_ = name;
  try {
    *r.root_ = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw Error(std::string("invalid TOML: ") + std::string(e.description()),
                {.file = name, .field = str("line ", src.begin.line, ", column ", src.begin.column)});
  }
  for (const auto& o : overrides) {
    apply_override(*r.root_, o);
    r.overridden_.insert(o.substr(0, o.find('=')));
  }
  return r;
}

std::string read_config_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("is a directory; expected a TOML config file (e.g. configs/demo.toml)", {.file = path});
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open config file", {.file = path, .found = std::strerror(errno)});
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error("cannot read config file", {.file = path, .found = std::strerror(errno)});
  return text.str();
}

ConfigReader ConfigReader::from_file(const std::string& path, const std::vector<std::string>& overrides) {
  return from_string(read_config_file(path), path, overrides);
}

const void* ConfigReader::find(const std::string& key) const {
  known_.insert(strip_indices(key));
  const toml::node* n = root_.get();
  for (const std::string& part : split_config_key(key)) {
    std::string name = part;
    long index = -1;
    if (auto lb = part.find('['); lb != std::string::npos) {
      name = part.substr(0, lb);
      index = std::stol(part.substr(lb + 1));
    }
    const toml::table* t = n ? n->as_table() : nullptr;
    if (!t) return nullptr;
    n = t->get(name);
    if (n && index >= 0) {
      const toml::array* a = n->as_array();
      n = (a && static_cast<size_t>(index) < a->size()) ? a->get(static_cast<size_t>(index)) : nullptr;
    }
    if (!n) return nullptr;
  }
  return n;
}

bool ConfigReader::has(const std::string& key) const { return find(key) != nullptr; }

void ConfigReader::require_present(const std::string& key) const {
  if (!find(key)) throw Error("required key is missing", {.file = file_, .field = key});
}

void ConfigReader::type_error(const std::string& key, const char* expected, const void* node) const {
  std::string where = overridden_.count(key) ? file_ + " (--set " + key + ")" : file_;
  throw Error("wrong type", {.file = where, .field = key, .expected = expected,
                             .found = describe(static_cast<const toml::node*>(node))});
}

namespace {
std::string toml_repr(int64_t v) { return std::to_string(v); }
std::string toml_repr(double v) {  // the shortest form that reads back as the same double
  char b[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}
std::string toml_repr(bool v) { return v ? "true" : "false"; }
std::string toml_repr(const std::string& v) { return "\"" + v + "\""; }
template <class T>
std::string toml_repr(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + toml_repr(v[i]);
  return out + "]";
}
}  // namespace

void ConfigReader::get(const std::string& key, int64_t& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n) {
    if (!n->is_integer()) type_error(key, "an integer", n);
    out = *n->value<int64_t>();
  }
  values_[key] = toml_repr(out);
}

void ConfigReader::get(const std::string& key, int& out) {
  int64_t v = out;
  get(key, v);
  if (v < INT_MIN || v > INT_MAX) throw Error("integer out of range", {.file = file_, .field = key, .expected = "a 32-bit integer", .found = std::to_string(v)});
  out = static_cast<int>(v);
}

void ConfigReader::get(const std::string& key, double& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n) {
    if (!n->is_number()) type_error(key, "a number", n);
    out = *n->value<double>();
  }
  values_[key] = toml_repr(out);
}

void ConfigReader::get(const std::string& key, float& out) {
  double v = out;
  get(key, v);
  out = static_cast<float>(v);
}

void ConfigReader::get(const std::string& key, bool& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n) {
    if (!n->is_boolean()) type_error(key, "true or false", n);
    out = *n->value<bool>();
  }
  values_[key] = toml_repr(out);
}

void ConfigReader::get(const std::string& key, std::string& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n) {
    if (!n->is_string()) type_error(key, "a string", n);
    out = *n->value<std::string>();
  }
  values_[key] = toml_repr(out);
}

namespace {
template <class T, class Check>
bool read_array(const toml::node* n, std::vector<T>& out, Check is_elem) {
  const toml::array* a = n->as_array();
  if (!a) return false;
  std::vector<T> v;
  for (const toml::node& e : *a) {
    if (!is_elem(e)) return false;
    v.push_back(*e.value<T>());
  }
  out = std::move(v);
  return true;
}
}  // namespace

void ConfigReader::get(const std::string& key, std::vector<double>& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n && !read_array<double>(n, out, [](const toml::node& e) { return e.is_number(); }))
    type_error(key, "an array of numbers", n);
  values_[key] = toml_repr(out);
}
void ConfigReader::get(const std::string& key, std::vector<int64_t>& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n && !read_array<int64_t>(n, out, [](const toml::node& e) { return e.is_integer(); }))
    type_error(key, "an array of integers", n);
  values_[key] = toml_repr(out);
}
void ConfigReader::get(const std::string& key, std::vector<std::string>& out) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (n && !read_array<std::string>(n, out, [](const toml::node& e) { return e.is_string(); }))
    type_error(key, "an array of strings", n);
  values_[key] = toml_repr(out);
}

size_t ConfigReader::table_count(const std::string& key) {
  auto* n = static_cast<const toml::node*>(find(key));
  if (!n) return 0;
  const toml::array* a = n->as_array();
  if (!a || !a->is_array_of_tables()) type_error(key, "an array of tables ([[...]])", n);
  return a->size();
}

void ConfigReader::finish() const {
  std::vector<std::string> leaves;
  collect_leaves(*root_, "", leaves);
  for (const std::string& leaf : leaves) {
    std::string generic = strip_indices(leaf);
    if (known_.count(generic)) continue;
    // Suggest the known key closest to the typo.
    std::string best;
    size_t best_d = SIZE_MAX;
    for (const std::string& k : known_) {
      size_t d = edit_distance(generic, k);
      if (d < best_d) { best_d = d; best = k; }
    }
    std::string where = overridden_.count(leaf) ? file_ + " (--set " + leaf + ")" : file_;
    std::string msg = "unknown key '" + leaf + "'";
    if (!best.empty() && best_d <= std::max<size_t>(3, generic.size() / 3)) msg += "; did you mean '" + best + "'?";
    throw Error(msg, {.file = where});
  }
}

}  // namespace zaya
