// The words every zaya command spells the same way: data types (f32/fp32/float32/float and
// bf16/bfloat16 are accepted wherever a dtype is asked for, and printed as f32 and bf16), and the
// nearest subcommand to a mistyped one.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace zaya::app {

// A CLI11 transform that turns any accepted dtype spelling into "f32" or "bf16" and rejects the
// rest with the accepted spellings.
CLI::Validator dtype_vocabulary();

// The candidate closest to `word` by edit distance (a prefix counts as close), or "" when none is
// close enough to be a likely typo.
std::string nearest_word(const std::string& word, const std::vector<std::string>& candidates);

// When argv names a subcommand that does not exist (at the top level or under one that takes
// subcommands, e.g. `zaya bench ckp`), the message that names it and the nearest real one;
// otherwise "". Options before the word are skipped (with their values).
std::string unknown_subcommand_message(const CLI::App& app, int argc, const char* const* argv);

}  // namespace zaya::app
