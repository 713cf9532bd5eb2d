#include "zaya/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "zaya/core/config.h"
#include "zaya/core/error.h"

namespace zaya::optim {

double lr_at(const OptimizerConfig& c, int64_t step) {
  ZAYA_CHECK(step >= 1, "lr_at: optimizer steps are 1-based, found step ", step);
  const double peak = c.lr, lo = c.min_lr;
  const int64_t W = c.warmup_steps, total = c.total_steps;
  // Warmup starts above zero: step 1 already gets lr/W, step W the full rate.
  if (step <= W) return peak * static_cast<double>(step) / static_cast<double>(W);
  switch (c.schedule) {
    case ScheduleKind::constant:
      return peak;
    case ScheduleKind::cosine: {
      if (step >= total) return lo;
      double x = static_cast<double>(step - W) / static_cast<double>(total - W);
      return lo + (peak - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * x));
    }
    case ScheduleKind::wsd: {
      if (step >= total) return lo;
      const int64_t decay = std::llround(c.decay_fraction * static_cast<double>(total));
      const int64_t decay_start = total - decay;
      if (step <= decay_start) return peak;
      double x = static_cast<double>(step - decay_start) / static_cast<double>(decay);
      double keep = c.decay_shape == DecayShape::linear ? 1.0 - x : 1.0 - std::sqrt(x);
      return lo + (peak - lo) * keep;
    }
  }
  return peak;
}

void BatchRamp::validate(const std::string& source) const {
  ZAYA_CHECK(micro >= 1, source, ": batch ramp: micro-batch multiple must be >= 1, found ", micro);
  ZAYA_CHECK(full >= micro && full % micro == 0, source,
             ": batch ramp: full batch must be a positive multiple of ", micro, ", found ", full);
  ZAYA_CHECK(start >= micro && start <= full, source, ": recipe.batch_ramp_start: expected a batch in [",
             micro, ", ", full, "], found ", start);
  ZAYA_CHECK(tokens >= 0, source, ": recipe.batch_ramp_tokens: expected >= 0, found ", tokens);
}

int64_t BatchRamp::batch_at(int64_t consumed) const {
  if (tokens <= 0 || consumed >= tokens || start >= full) return full;
  double f = static_cast<double>(std::max<int64_t>(consumed, 0)) / static_cast<double>(tokens);
  double b = static_cast<double>(start) + f * static_cast<double>(full - start);
  // Round down to the micro multiple, but never below the start batch (itself rounded up).
  int64_t lo = (start + micro - 1) / micro * micro;
  int64_t n = static_cast<int64_t>(b) / micro * micro;
  return std::clamp(n, lo, full);
}

int64_t Recipe::total_tokens() const {
  int64_t n = 0;
  for (const Phase& p : phases) n += p.tokens;
  return n;
}

int64_t Recipe::phase_start(int i) const {
  ZAYA_CHECK(i >= 0 && i < static_cast<int>(phases.size()), "recipe: phase index ", i, " out of range [0, ",
             phases.size(), ")");
  int64_t n = 0;
  for (int j = 0; j < i; ++j) n += phases[j].tokens;
  return n;
}

int Recipe::phase_at(int64_t consumed) const {
  ZAYA_CHECK(!phases.empty(), "recipe: no [[recipe.phases]] defined");
  int64_t end = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    end += phases[i].tokens;
    if (consumed < end) return static_cast<int>(i);
  }
  return static_cast<int>(phases.size()) - 1;
}

BatchRamp Recipe::batch_ramp(int64_t micro) const {
  ZAYA_CHECK(!phases.empty(), "recipe: no [[recipe.phases]] defined");
  BatchRamp r;
  r.full = phases[0].batch_size;
  r.start = batch_ramp_start > 0 ? batch_ramp_start : r.full;
  r.tokens = batch_ramp_tokens;
  r.micro = micro;
  r.validate("recipe");
  return r;
}

RecipeStep Recipe::step_at(int64_t consumed, int64_t micro) const {
  RecipeStep s;
  s.phase = phase_at(consumed);
  const Phase& p = phases[static_cast<size_t>(s.phase)];
  s.seq_len = p.seq_len;
  s.batch_size = s.phase == 0 ? batch_ramp(micro).batch_at(consumed) : p.batch_size;
  return s;
}

int64_t Recipe::num_steps(int64_t micro) const {
  const int64_t total = total_tokens();
  int64_t steps = 0;
  for (int64_t consumed = 0; consumed < total; ++steps) consumed += step_at(consumed, micro).tokens();
  return steps;
}

void Recipe::validate(const std::string& source) const {
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    const std::string key = str("recipe.phases[", i, "].");
    auto fail = [&](const std::string& field, const std::string& expected, const std::string& found) {
      throw Error("invalid value", ErrorContext{source, key + field, expected, found});
    };
    if (p.tokens <= 0) fail("tokens", "a positive token count", str(p.tokens));
    if (p.seq_len <= 0) fail("seq_len", "a positive sequence length", str(p.seq_len));
    if (!(p.rope_theta >= 0) || !std::isfinite(p.rope_theta))  // 0: the model's rope_theta
      fail("rope_theta", "a positive number", str(p.rope_theta));
    if (p.batch_size <= 0) fail("batch_size", "a positive batch size (sequences)", str(p.batch_size));
    double sum = 0;
    for (double w : p.data_weights) {
      if (!(w >= 0) || !std::isfinite(w)) fail("data_weights", "non-negative weights", str(w));
      sum += w;
    }
    if (!p.data_weights.empty() && !(sum > 0))
      fail("data_weights", "at least one positive weight", "all zero");
    if (p.batch_size > std::numeric_limits<int64_t>::max() / p.seq_len)
      fail("batch_size", "batch_size x seq_len tokens within a signed 64-bit count", str(p.batch_size));
  }
  // Steps add up tokens in int64 and a step can overshoot its phase by up to one step's tokens, so
  // the phases' total plus the largest step must fit (else the sums overflow and the step count
  // never ends).
  int64_t max_step_tokens = 0, total = 0;
  for (const Phase& p : phases) max_step_tokens = std::max(max_step_tokens, p.seq_len * p.batch_size);
  for (size_t i = 0; i < phases.size(); ++i) {
    if (phases[i].tokens > std::numeric_limits<int64_t>::max() - max_step_tokens - total)
      throw Error("invalid value",
                  ErrorContext{source, str("recipe.phases[", i, "].tokens"),
                               str("a total over all phases of at most ",
                                   std::numeric_limits<int64_t>::max() - max_step_tokens, " tokens"),
                               str(phases[i].tokens)});
    total += phases[i].tokens;
  }
  if (batch_ramp_start < 0)
    throw Error("invalid value",
                ErrorContext{source, "recipe.batch_ramp_start", ">= 0", str(batch_ramp_start)});
  if (batch_ramp_tokens < 0)
    throw Error("invalid value",
                ErrorContext{source, "recipe.batch_ramp_tokens", ">= 0", str(batch_ramp_tokens)});
  if (!phases.empty() && batch_ramp_tokens > phases[0].tokens)
    throw Error("invalid value", ErrorContext{source, "recipe.batch_ramp_tokens",
                                              str("<= the first phase's tokens ", phases[0].tokens,
                                                  " (the ramp lies within phase 0)"),
                                              str(batch_ramp_tokens)});
  if (!phases.empty() && batch_ramp_start > phases[0].batch_size)
    throw Error("invalid value", ErrorContext{source, "recipe.batch_ramp_start",
                                              str("<= the first phase's batch_size ", phases[0].batch_size),
                                              str(batch_ramp_start)});
}

Recipe Recipe::from_toml(ConfigReader& r) {
  Recipe rec;
  r.get("recipe.batch_ramp_start", rec.batch_ramp_start);
  r.get("recipe.batch_ramp_tokens", rec.batch_ramp_tokens);
  size_t n = r.table_count("recipe.phases");
  for (size_t i = 0; i < n; ++i) {
    const std::string k = str("recipe.phases[", i, "].");
    Phase p;
    p.name = str("phase", i);
    r.get(k + "name", p.name);
    r.require(k + "tokens", p.tokens);
    r.require(k + "seq_len", p.seq_len);
    if (r.has(k + "rope_theta")) {
      r.get(k + "rope_theta", p.rope_theta);
      // An explicit 0 would read as "the model's"; say it is wrong instead.
      if (!(p.rope_theta > 0))
        throw Error("invalid value",
                    ErrorContext{r.file(), k + "rope_theta", "a positive number", str(p.rope_theta)});
    }
    r.get(k + "data_weights", p.data_weights);
    r.require(k + "batch_size", p.batch_size);
    rec.phases.push_back(std::move(p));
  }
  rec.validate(r.file());
  return rec;
}

}  // namespace zaya::optim
