// `zaya size --suggest`: nearby shapes at the same parameter budget, ranked by predicted step time.
#pragma once

#include <string>
#include <vector>

#include "zaya/sizing/decode_roofline.h"
#include "zaya/sizing/size_report.h"

namespace zaya::sizing {

enum class Budget { total, active };
Budget parse_budget(const std::string& name, const std::string& flag);  // "total" | "active"

struct SuggestOptions {
  Budget budget = Budget::total;
  double tolerance = 0.05;  // candidates within ±5% of the original's parameter count
  int max_results = 10;
  // Joint objective: score = (1 − w) · step time / the original's + w · decode latency / the
  // original's, the decode step at `decode_batch` sequences of `decode_context` positions (0: the
  // run's seq). w = 0 ranks by training step time alone.
  double decode_weight = 0;
  int64_t decode_batch = 1;
  int64_t decode_context = 0;
  ServeOptions serve;
};

struct Suggestion {
  model::ModelConfig config;
  SizeReport report;
  double budget_ratio = 1;  // candidate's budgeted parameters / the original's
  bool is_original = false;
  DecodeStep decode;        // at the options' decode batch and context
  double score = 0;         // the joint objective (1 for the original)
};

// Candidates: hidden size H ± up to 3 steps of max(64, H/8 rounded to 64); query heads from half
// to double (multiples of nkv, GQA group kept integral); head dim 64 or 128; experts E/2, E, 2E;
// the expert width I then solved so the budget matches (rounded to 64, and its 64-neighbours).
// Kept: within the tolerance and passing every hard sizing rule. Sorted by predicted step time, or
// by the joint score when decode_weight > 0 (ties: closer to the budget first), the original
// included and flagged. Needs a hardware profile.
std::vector<Suggestion> suggest_shapes(const model::ModelConfig& c, const RunShape& run, const HardwareProfile& hw,
                                       const SuggestOptions& options);
std::string format_suggestions(const std::vector<Suggestion>& s, const SuggestOptions& options);

}  // namespace zaya::sizing
