#include "cli_vocabulary.h"

#include <algorithm>
#include <cctype>

namespace zaya::app {

CLI::Validator dtype_vocabulary() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::string v = value;
        std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
        if (v == "f32" || v == "fp32" || v == "float32" || v == "float") {
          value = "f32";
          return {};
        }
        if (v == "bf16" || v == "bfloat16") {
          value = "bf16";
          return {};
        }
        return "expected f32 (or fp32, float32, float) or bf16 (or bfloat16), found '" + value + "'";
      },
      "f32|bf16", "dtype");
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string nearest_word(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    const bool prefix = word.size() >= 2 && c.rfind(word, 0) == 0;
    const size_t d = prefix ? 1 : edit_distance(word, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  // A third of the word wrong (at least 2 edits allowed) is still a typo; more is another word.
  return best_distance <= std::max<size_t>(2, word.size() / 3) ? best : std::string();
}

std::string unknown_subcommand_message(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* node = &app;
  std::string path = "zaya";
  for (int i = 1; i < argc; ++i) {
    const std::string tok = argv[i];
    if (tok.size() > 1 && tok[0] == '-') {
      if (tok.find('=') != std::string::npos) continue;
      const CLI::Option* opt = nullptr;  // the command's own, else a parent's (global options)
      for (const CLI::App* a = node; a != nullptr && opt == nullptr; a = a->get_parent()) {
        try {
          opt = a->get_option(tok);
        } catch (const CLI::Error&) {  // not this command's
        }
      }
      if (opt && opt->get_type_size_min() > 0 && !opt->get_positional()) ++i;  // skip its value
      continue;
    }
    const auto subs = node->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return {};  // a positional argument of a command without subcommands
    const auto known = std::find_if(subs.begin(), subs.end(), [&](const CLI::App* s) { return s->check_name(tok); });
    if (known != subs.end()) {
      node = *known;
      path += " " + node->get_name();
      continue;
    }
    std::vector<std::string> names;  // the listed ones: hidden (group "") commands are for tests
    for (const CLI::App* s : subs)
      if (!s->get_group().empty()) names.push_back(s->get_name());
    std::string msg = "'" + tok + "' is not a " + path + " command";
    if (const std::string near = nearest_word(tok, names); !near.empty()) msg += "; did you mean '" + near + "'?";
    msg += "\n" + path + " commands:";
    for (const std::string& n : names) msg += " " + n;
    return msg;
  }
  return {};
}

}  // namespace zaya::app
