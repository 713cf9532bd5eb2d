#include "zaya/train/config_change.h"

#include <algorithm>
#include <set>

namespace zaya::train {

const std::vector<std::string>& safe_config_keys() {
  static const std::vector<std::string> kSafe = {
      "ckpt.every",         "ckpt.keep_every", "ckpt.keep_last",  "ckpt.save_final",
      "ckpt.snapshot",      "data.tokenizer",  "data.val",        "parallel.bucket_mb",
      "parallel.cp",
      // How the step's attention meets the K/V exchange: the same math, merged in another order.
      "parallel.cp_overlap",
      // The same run on another device: the same math, rounded in other orders (not bitwise).
      "parallel.device",
      // Changes when the step waits for the parameters, not their values.
      "parallel.overlap_param_gather",
      "parallel.timeout_s", "train.eval_every",
      "train.eval_samples", "train.heartbeat", "train.init_from", "train.inject", "train.log_every",
      "train.max_skipped_steps", "train.mfu_peak", "train.mfu_peak_flops", "train.out_dir", "train.progress",
      "train.recompute",    "train.steps",
  };
  return kSafe;
}

bool config_change_is_safe(const std::string& key) {
  const std::vector<std::string>& safe = safe_config_keys();
  return std::binary_search(safe.begin(), safe.end(), key);
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
