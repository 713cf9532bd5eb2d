#include "zaya/optim/config.h"

#include <cmath>

#include "zaya/core/config.h"
#include "zaya/core/error.h"

namespace zaya::optim {
namespace {

[[noreturn]] void bad(const std::string& source, const std::string& key, const std::string& expected,
                      const std::string& found) {
  throw Error("invalid value", ErrorContext{source, "optim." + key, expected, found});
}

void check_range(const std::string& source, const std::string& key, double v, double lo, double hi,
                 bool lo_open, bool hi_open) {
  bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    bad(source, key, str("a number in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]"), str(v));
}

}  // namespace

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::wsd:
      return "wsd";
    case ScheduleKind::cosine:
      return "cosine";
    case ScheduleKind::constant:
      return "constant";
  }
  return "?";
}

const char* decay_shape_name(DecayShape s) { return s == DecayShape::linear ? "linear" : "1-sqrt"; }

void OptimizerConfig::validate(const std::string& source) const {
  check_range(source, "lr", lr, 0, 1e3, true, false);
  check_range(source, "min_lr", min_lr, 0, lr, false, false);
  if (total_steps < 1) bad(source, "total_steps", "an integer >= 1", str(total_steps));
  if (warmup_steps < 0 || warmup_steps > total_steps)
    bad(source, "warmup_steps", str("an integer in [0, total_steps = ", total_steps, "]"), str(warmup_steps));
  check_range(source, "decay_fraction", decay_fraction, 0, 1, false, false);
  if (schedule == ScheduleKind::wsd) {
    // The decay must start after warmup ends, or the two ramps would overlap.
    int64_t decay = static_cast<int64_t>(std::llround(decay_fraction * static_cast<double>(total_steps)));
    if (warmup_steps + decay > total_steps)
      bad(source, "decay_fraction",
          str("warmup_steps + decay_fraction * total_steps <= total_steps (", warmup_steps, " + ", decay,
              " > ", total_steps, ")"),
          str(decay_fraction));
  }
  check_range(source, "weight_decay", weight_decay, 0, 1e3, false, false);
  check_range(source, "beta1", beta1, 0, 1, false, true);
  check_range(source, "beta2", beta2, 0, 1, false, true);
  check_range(source, "eps", eps, 0, 1, true, false);
  check_range(source, "grad_clip", grad_clip, 0, 1e30, false, false);
  check_range(source, "muon_momentum", muon_momentum, 0, 1, false, true);
  if (muon_ns_steps < 1 || muon_ns_steps > 100)
    bad(source, "muon_ns_steps", "an integer in [1, 100]", str(muon_ns_steps));
  if (muon_min_dim < 1) bad(source, "muon_min_dim", "an integer >= 1", str(muon_min_dim));
  for (const std::string& s : muon_exclude)
    if (s.empty()) bad(source, "muon_exclude", "non-empty name substrings", "an empty string");
  check_range(source, "balance_lr", balance_lr, 0, 1e3, true, false);
  check_range(source, "balance_beta1", balance_beta1, 0, 1, false, true);
  check_range(source, "balance_beta2", balance_beta2, 0, 1, false, true);
  check_range(source, "balance_eps", balance_eps, 0, 1, true, false);
}

OptimizerConfig OptimizerConfig::from_toml(ConfigReader& r) {
  OptimizerConfig c;
  const std::string& src = r.file();
  r.get("optim.lr", c.lr);
  r.get("optim.min_lr", c.min_lr);
  r.get("optim.warmup_steps", c.warmup_steps);
  std::string schedule = schedule_name(c.schedule);
  r.get("optim.schedule", schedule);
  if (schedule == "wsd")
    c.schedule = ScheduleKind::wsd;
  else if (schedule == "cosine")
    c.schedule = ScheduleKind::cosine;
  else if (schedule == "constant")
    c.schedule = ScheduleKind::constant;
  else
    bad(src, "schedule", "\"wsd\", \"cosine\" or \"constant\"", "\"" + schedule + "\"");
  r.get("optim.decay_fraction", c.decay_fraction);
  std::string shape = decay_shape_name(c.decay_shape);
  r.get("optim.decay_shape", shape);
  if (shape == "linear")
    c.decay_shape = DecayShape::linear;
  else if (shape == "1-sqrt")
    c.decay_shape = DecayShape::one_minus_sqrt;
  else
    bad(src, "decay_shape", "\"linear\" or \"1-sqrt\"", "\"" + shape + "\"");
  r.get("optim.total_steps", c.total_steps);
  r.get("optim.weight_decay", c.weight_decay);
  r.get("optim.beta1", c.beta1);
  r.get("optim.beta2", c.beta2);
  r.get("optim.eps", c.eps);
  r.get("optim.grad_clip", c.grad_clip);
  r.get("optim.muon", c.muon);
  r.get("optim.muon_momentum", c.muon_momentum);
  r.get("optim.muon_ns_steps", c.muon_ns_steps);
  r.get("optim.muon_ns_bf16", c.muon_ns_bf16);
  r.get("optim.muon_min_dim", c.muon_min_dim);
  r.get("optim.muon_exclude", c.muon_exclude);
  r.get("optim.balance_enabled", c.balance_enabled);
  r.get("optim.balance_lr", c.balance_lr);
  r.get("optim.balance_beta1", c.balance_beta1);
  r.get("optim.balance_beta2", c.balance_beta2);
  r.get("optim.balance_eps", c.balance_eps);
  r.get("optim.balance_follow_schedule", c.balance_follow_schedule);
  c.validate(src);
  return c;
}

}  // namespace zaya::optim
