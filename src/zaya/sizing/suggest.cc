#include "zaya/sizing/suggest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <tuple>

#include "zaya/core/error.h"
#include "zaya/model/params.h"

namespace zaya::sizing {

Budget parse_budget(const std::string& name, const std::string& flag) {
  if (name == "total") return Budget::total;
  if (name == "active") return Budget::active;
  throw Error("unknown parameter budget", {.field = flag, .expected = "total or active", .found = name});
}

namespace {

int64_t budgeted(const model::ModelConfig& c, Budget b) {
  const auto n = model::count_parameters(c);
  return b == Budget::total ? n.total : n.active;
}

int64_t round64(double v) { return std::max<int64_t>(64, static_cast<int64_t>(std::llround(v / 64.0)) * 64); }

bool hard_rules_pass(const SizeReport& r) {
  for (const auto& rule : r.rules)
    if (rule.hard && !rule.ok) return false;
  return true;
}

}  // namespace

std::vector<Suggestion> suggest_shapes(const model::ModelConfig& c, const RunShape& run, const HardwareProfile& hw,
                                       const SuggestOptions& o) {
  ZAYA_CHECK(o.tolerance > 0 && o.tolerance < 1, "--suggest tolerance must be in (0, 1), found ", o.tolerance);
  ZAYA_CHECK(o.decode_weight >= 0 && o.decode_weight <= 1, "--decode-weight must be in [0, 1], found ", o.decode_weight);
  ZAYA_CHECK(o.decode_batch >= 1, "--objective-batch must be >= 1, found ", o.decode_batch);
  const int64_t context = o.decode_context > 0 ? o.decode_context : run.seq;
  if (o.decode_weight > 0 && !(hw.memory_bandwidth > 0))
    throw Error("the joint objective prices decode by memory bandwidth, and the profile has none",
                {.field = "--decode-weight", .expected = "a profile with memory_bandwidth > 0 (or --decode-weight 0)",
                 .found = hw.name + ": memory_bandwidth " + std::to_string(hw.memory_bandwidth)});
  const double target = static_cast<double>(budgeted(c, o.budget));
  std::vector<Suggestion> out;
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> seen;
  auto consider = [&](model::ModelConfig m, bool original) {
    auto key = std::make_tuple(m.hidden_size, m.num_attention_heads, m.head_dim, m.num_experts, m.moe_intermediate_size);
    if (!seen.insert(key).second) return;
    try {
      m.validate("--suggest candidate");
    } catch (const Error&) {
      return;  // e.g. heads not divisible by kv heads
    }
    const double ratio = static_cast<double>(budgeted(m, o.budget)) / target;
    ServeOptions serve = o.serve;
    serve.measured_experts = false;  // every candidate priced alike (ServeOptions)
    Suggestion s{m, size_model(m, run, hw), ratio, original, decode_step(m, o.decode_batch, context, &hw, serve), 0};
    if (!original && (std::abs(ratio - 1) > o.tolerance || !hard_rules_pass(s.report))) return;
    out.push_back(std::move(s));
  };
  consider(c, true);

  const int64_t step = round64(static_cast<double>(c.hidden_size) / 8);
  const int64_t nkv = c.num_key_value_heads;
  for (int dh = -3; dh <= 3; ++dh) {
    const int64_t H = c.hidden_size + dh * step;
    if (H < 64) continue;
    for (int64_t hd : {int64_t{64}, int64_t{128}}) {
      // Query width near the original's, scaled with H; heads a multiple of the kv heads.
      for (double f : {0.5, 0.75, 1.0, 1.5, 2.0}) {
        const double want_q = static_cast<double>(c.q_dim()) * static_cast<double>(H) / static_cast<double>(c.hidden_size) * f;
        const int64_t nq = std::max<int64_t>(nkv, static_cast<int64_t>(std::llround(want_q / static_cast<double>(hd) / nkv)) * nkv);
        for (int64_t E : {c.num_experts / 2, c.num_experts, c.num_experts * 2}) {
          if (E < 1) continue;
          model::ModelConfig m = c;
          m.hidden_size = H;
          m.head_dim = hd;
          m.num_attention_heads = nq;
          m.num_experts = E;
          // Parameters are affine in I: solve for the budget from I = 64 and I = 128.
          m.moe_intermediate_size = 64;
          const double p64 = static_cast<double>(budgeted(m, o.budget));
          m.moe_intermediate_size = 128;
          const double slope = (static_cast<double>(budgeted(m, o.budget)) - p64) / 64.0;
          if (slope <= 0) continue;
          const double I = 64 + (target - p64) / slope;
          if (I < 64) continue;
          for (int64_t d : {int64_t{-64}, int64_t{0}, int64_t{64}}) {
            m.moe_intermediate_size = round64(I) + d;
            if (m.moe_intermediate_size >= 64) consider(m, false);
          }
        }
      }
    }
  }
  // out[0] is the original: the scores' unit.
  const double step0 = out.front().report.step_time_s, decode0 = out.front().decode.step_s, w = o.decode_weight;
  for (auto& s : out)
    s.score = w > 0 ? (1 - w) * s.report.step_time_s / step0 + w * s.decode.step_s / decode0 : s.report.step_time_s / step0;
  std::stable_sort(out.begin(), out.end(), [w](const Suggestion& a, const Suggestion& b) {
    // w = 0 compares the step times themselves (not their quotients, which could round two
    // different times to one score).
    if (w > 0 && a.score != b.score) return a.score < b.score;
    if (w == 0 && a.report.step_time_s != b.report.step_time_s) return a.report.step_time_s < b.report.step_time_s;
    return std::abs(a.budget_ratio - 1) < std::abs(b.budget_ratio - 1);
  });
  // Keep the best max_results plus the original wherever it ranks.
  std::vector<Suggestion> kept;
  int shown = 0;
  for (auto& s : out)
    if (s.is_original || shown++ < o.max_results) kept.push_back(std::move(s));
  return kept;
}

std::string format_suggestions(const std::vector<Suggestion>& s, const SuggestOptions& o) {
  std::ostringstream out;
  char line[320];
  const bool joint = o.decode_weight > 0;
  if (joint) {
    std::snprintf(line, sizeof line,
                  "suggestions    same %s parameters ±%.0f%%, hard sizing rules pass, sorted by %.2f · step time + %.2f · "
                  "decode latency at batch %lld (each relative to the original)\n",
                  o.budget == Budget::total ? "total" : "active", 100 * o.tolerance, 1 - o.decode_weight, o.decode_weight,
                  static_cast<long long>(o.decode_batch));
  } else {
    std::snprintf(line, sizeof line,
                  "suggestions    same %s parameters ±%.0f%%, hard sizing rules pass, sorted by predicted step time\n",
                  o.budget == Budget::total ? "total" : "active", 100 * o.tolerance);
  }
  out << line;
  std::snprintf(line, sizeof line, "  %-4s %6s %6s %5s %4s %6s %9s %9s %8s %10s %7s", "rank", "H", "heads", "hd", "E", "I",
                "total", "active", "budget", "step (s)", "mfu");
  out << line;
  if (joint) {
    std::snprintf(line, sizeof line, " %12s %7s", "decode (ms)", "score");
    out << line;
  }
  out << " note\n";
  int rank = 0;
  for (const auto& x : s) {
    ++rank;
    const auto& c = x.config;
    bool advisory_ok = true;
    for (const auto& r : x.report.rules) advisory_ok &= r.ok || r.hard;
    std::string note = x.is_original ? "original" : "";
    if (!advisory_ok) note += std::string(note.empty() ? "" : ", ") + "small expert GEMMs";
    std::snprintf(line, sizeof line, "  %-4d %6lld %6lld %5lld %4lld %6lld %8.3fB %8.3fB %+7.1f%% %10.4f %6.1f%%", rank,
                  static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_attention_heads),
                  static_cast<long long>(c.head_dim), static_cast<long long>(c.num_experts),
                  static_cast<long long>(c.moe_intermediate_size), static_cast<double>(x.report.total) / 1e9,
                  static_cast<double>(x.report.active) / 1e9, 100 * (x.budget_ratio - 1), x.report.step_time_s,
                  100 * x.report.mfu);
    out << line;
    if (joint) {
      std::snprintf(line, sizeof line, " %12.3f %7.3f", 1e3 * x.decode.step_s, x.score);
      out << line;
    }
    out << " " << note << "\n";
  }
  return out.str();
}

}  // namespace zaya::sizing
