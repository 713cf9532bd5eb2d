#include "zaya/sizing/goodput.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "zaya/core/error.h"

namespace zaya::sizing {

void GoodputModel::validate() const {
  auto need = [](bool ok, const char* field, const char* expected, double found) {
    if (!ok) throw Error("invalid value", {.field = field, .expected = expected, .found = std::to_string(found)});
  };
  need(gpus >= 1, "--gpus", "at least 1", gpus);
  need(failures_per_gpu_hour > 0 && std::isfinite(failures_per_gpu_hour), "--failures-per-gpu-hour", "> 0",
       failures_per_gpu_hour);
  need(ckpt_stall_s > 0 && std::isfinite(ckpt_stall_s), "--ckpt-stall-s", "> 0 seconds", ckpt_stall_s);
  need(detect_s >= 0 && std::isfinite(detect_s), "--detect-s", ">= 0 seconds", detect_s);
  need(recover_s >= 0 && std::isfinite(recover_s), "--recover-s", ">= 0 seconds", recover_s);
}

double goodput(const GoodputModel& m, double interval_s) {
  if (!(interval_s > 0)) return 0;
  const double lambda = m.failures_per_s();
  const double wasted = lambda * (m.detect_s + m.recover_s + (interval_s + m.ckpt_stall_s) / 2);
  return std::max(0.0, interval_s / (interval_s + m.ckpt_stall_s) * (1 - wasted));
}

double young_interval_s(const GoodputModel& m) { return std::sqrt(2 * m.ckpt_stall_s / m.failures_per_s()); }

double best_interval_s(const GoodputModel& m) {
  // goodput() is unimodal in τ (a rising stall term times a falling loss term): golden section
  // on log τ between a second and a year.
  double a = 0, b = std::log(365.0 * 86400);
  const double r = (std::sqrt(5.0) - 1) / 2;
  double x1 = b - r * (b - a), x2 = a + r * (b - a);
  double f1 = goodput(m, std::exp(x1)), f2 = goodput(m, std::exp(x2));
  for (int i = 0; i < 200 && b - a > 1e-9; ++i) {
    if (f1 < f2) {
      a = x1, x1 = x2, f1 = f2, x2 = a + r * (b - a), f2 = goodput(m, std::exp(x2));
    } else {
      b = x2, x2 = x1, f2 = f1, x1 = b - r * (b - a), f1 = goodput(m, std::exp(x1));
    }
  }
  return std::exp((a + b) / 2);
}

std::string format_goodput(const GoodputModel& m, const std::vector<double>& intervals_s) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "# goodput: %d GPUs, %.3g failures per GPU-hour (MTBF %.1f h), checkpoint stall %.3g s, detection %.3g s, "
                "recovery %.3g s\n# %14s %10s\n",
                m.gpus, m.failures_per_gpu_hour, m.mtbf_hours(), m.ckpt_stall_s, m.detect_s, m.recover_s,
                "interval min", "goodput");
  out += line;
  for (double t : intervals_s) {
    std::snprintf(line, sizeof line, "  %14.1f %9.2f%%\n", t / 60, 100 * goodput(m, t));
    out += line;
  }
  const double young = young_interval_s(m), best = best_interval_s(m);
  std::snprintf(line, sizeof line,
                "# Young's interval sqrt(2C/lambda): %.1f min (goodput %.2f%%); the model's best: %.1f min (goodput %.2f%%)\n",
                young / 60, 100 * goodput(m, young), best / 60, 100 * goodput(m, best));
  out += line;
  return out;
}

}  // namespace zaya::sizing
