// libFuzzer target: the TOML run config with `--set` overrides (train::parse_run_config, which
// reads the model, optimizer, data, train, ckpt, parallel and recipe sections). Any input must end
// in a RunConfig or a zaya::Error; a crash, hang, sanitizer report or other exception is a bug.
//
// Input layout: the TOML text, then up to kMaxOverrides `--set` arguments, each after a NUL byte
// (a NUL is never valid TOML, so the split loses nothing the parser could accept).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/train/run_config.h"

namespace {
constexpr size_t kMaxOverrides = 4;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  while (parts.size() < kMaxOverrides) {
    const size_t nul = in.find('\0');
    if (nul == std::string_view::npos) break;
    parts.emplace_back(in.substr(0, nul));
    in.remove_prefix(nul + 1);
  }
  parts.emplace_back(in);
  const std::string text = std::move(parts.front());
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  try {
    const auto c = zaya::train::parse_run_config(text, "fuzz/run.toml", overrides);
    // What an accepted config promises: a valid model, a step that fits the model's positions, a
    // schedule at least as long as the run.
    c.model.validate("fuzz/run.toml");
    if (c.train.seq_len > c.model.max_position_embeddings) __builtin_trap();
    if (c.train.steps <= 0 || c.train.micro_batch <= 0 || c.train.seq_len <= 0 || c.train.grad_accum <= 0)
      __builtin_trap();
    // A checkpoint stores text and overrides and parses them again on resume: that must succeed.
    zaya::train::parse_run_config(c.text, c.source, c.overrides);
  } catch (const zaya::Error&) {
  }
  return 0;
}
