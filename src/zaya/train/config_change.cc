#include "zaya/train/config_change.h"

#include <set>

namespace zaya::train {

bool config_change_is_safe(const std::string& key) {
  static const std::set<std::string> kSafe = {
      "train.log_every",     "train.eval_every",  "train.eval_samples", "train.progress",
      "train.out_dir",       "train.init_from",   "train.steps",        "train.max_skipped_steps",
      "ckpt.every",          "ckpt.keep_last",    "ckpt.keep_every",    "ckpt.save_final",
      "ckpt.snapshot",       "data.val",          "data.tokenizer",
  };
  return kSafe.count(key) > 0;
}

std::vector<ConfigChange> config_changes(const RunConfig& saved, const RunConfig& now) {
  std::set<std::string> keys;
  for (const auto& [k, v] : saved.values) keys.insert(k);
  for (const auto& [k, v] : now.values) keys.insert(k);
  std::vector<ConfigChange> out;
  for (const std::string& k : keys) {
    auto a = saved.values.find(k), b = now.values.find(k);
    const std::string was = a == saved.values.end() ? "(none)" : a->second;
    const std::string is = b == now.values.end() ? "(none)" : b->second;
    if (was != is) out.push_back({k, was, is, config_change_is_safe(k)});
  }
  return out;
}

}  // namespace zaya::train
