// A resumed run against the config its checkpoint was written with: what changed, and whether the
// change keeps the run on the checkpoint's trajectory (docs/train.md, "Resuming with a changed
// config").
#pragma once

#include <string>
#include <vector>

#include "zaya/train/run_config.h"

namespace zaya::train {

struct ConfigChange {
  std::string key;    // "train.seq_len"
  std::string was;    // the checkpoint's effective value ("(none)" when its config lacks the key)
  std::string now;    // this run's
  bool safe = false;  // changes only logging, evaluation, checkpoint policy or where files go
};

// True for keys whose change leaves what the run computes bit for bit the same: logging and
// progress, evaluation (it only reads the model), checkpoint policy, where the run's files are,
// the run's length (train.steps; the schedule's length is optim.total_steps, which is not safe),
// the start point of a fresh run (train.init_from, unused by a resume), the tokenizer (only used
// for text) and the skipped-update limit. Every other key, including one added later, is not.
bool config_change_is_safe(const std::string& key);
const std::vector<std::string>& safe_config_keys();  // those keys, sorted

// The keys whose effective values differ (RunConfig::values), in key order.
std::vector<ConfigChange> config_changes(const RunConfig& saved, const RunConfig& now);

}  // namespace zaya::train
