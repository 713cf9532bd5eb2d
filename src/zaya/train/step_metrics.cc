#include "zaya/train/step_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace zaya::train {

ExpertLoads expert_loads(const std::vector<int64_t>& counts, const std::vector<int64_t>& skipped, int64_t L,
                         int64_t E) {
  ExpertLoads out;
  for (int64_t l = 0; l < L; ++l) {
    int64_t routed = 0;
    for (int64_t e = 0; e < E; ++e) routed += counts[static_cast<size_t>(l * E + e)];
    double h = 0, mx = 0, mn = 1e30;
    for (int64_t e = 0; e < E; ++e) {
      double f = routed ? static_cast<double>(counts[static_cast<size_t>(l * E + e)]) / static_cast<double>(routed)
                        : 0;
      if (f > 0) h -= f * std::log(f);
      mx = std::max(mx, f * static_cast<double>(E));
      mn = std::min(mn, f * static_cast<double>(E));
    }
    double hn = E > 1 ? h / std::log(static_cast<double>(E)) : 1.0;
    out.entropy.push_back(hn);
    out.max_load.push_back(mx);
    out.min_load.push_back(mn);
    out.skip_fraction.push_back(static_cast<double>(skipped[static_cast<size_t>(l)]) /
                                static_cast<double>(routed + skipped[static_cast<size_t>(l)]));
    out.min_entropy = std::min(out.min_entropy, hn);
  }
  return out;
}

namespace {
// This process's resident memory now, from /proc (0 where there is none).
int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}
// ... and its peak since the start (getrusage's maximum resident set, in KiB on Linux).
int64_t peak_resident_bytes() {
  struct rusage u;
  std::memset(&u, 0, sizeof u);
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_maxrss) * 1024 : 0;
}
}  // namespace

nlohmann::json step_record(const StepResult& r, int64_t step, int64_t tokens, double flops_per_token,
                           const std::optional<PeakFlops>& peak, const ExpertLoads& loads) {
  const double tok_s = static_cast<double>(r.tokens) / r.time.step;
  const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int64_t rss = resident_bytes();
  nlohmann::json rec = {{"step", step},
                        {"wall_time", wall},  // Unix seconds: when the step ended
                        {"tokens", tokens},
                        {"loss", r.loss},
                        {"lr", r.update.lr},
                        {"grad_norm", r.update.grad_norm},
                        {"clipped", r.update.clipped},
                        {"skipped_update", r.update.skipped},
                        {"tokens_per_s", tok_s},
                        {"tflops", flops_per_token * tok_s / 1e12},  // achieved model TFLOP/s
                        {"rss_bytes", rss},
                        // The kernel updates its high-water mark lazily: never below the current.
                        {"peak_rss_bytes", std::max(rss, peak_resident_bytes())},
                        {"time",
                         {{"data", r.time.data},
                          {"forward", r.time.forward},
                          {"backward", r.time.backward},
                          {"optimizer", r.time.optimizer},
                          {"checkpoint_fence", r.time.checkpoint_fence},
                          {"step", r.time.step}}}};
  if (peak && peak->flops_per_s > 0) {
    rec["mfu"] = flops_per_token * tok_s / peak->flops_per_s;
    rec["mfu_peak"] = peak->name;
    rec["mfu_peak_tflops"] = peak->flops_per_s / 1e12;
  }
  if (r.time.sync.buckets > 0)
    rec["data_parallel"] = {{"buckets", r.time.sync.buckets},
                            {"comm", r.time.sync.comm_s},
                            {"hidden", r.time.sync.hidden_s},
                            {"exposed", r.time.sync.exposed_s},
                            {"hidden_fraction", r.time.sync.hidden_fraction()},
                            {"param_gather", r.time.sync.gather_s},
                            {"param_gather_exposed", r.time.sync.gather_exposed_s}};
  rec["expert_entropy"] = loads.entropy;
  rec["expert_max_load"] = loads.max_load;
  rec["expert_min_load"] = loads.min_load;
  rec["skip_fraction"] = loads.skip_fraction;
  return rec;
}

}  // namespace zaya::train
