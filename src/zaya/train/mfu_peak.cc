#include "zaya/train/mfu_peak.h"

#include <cstdio>
#include <vector>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/log.h"
#include "zaya/core/threads.h"

namespace zaya::train {

std::string mfu_peak_choices() {
  std::string s = "\"auto\", \"cpu\"";
  for (const std::string& n : datasheet_peak_names()) s += ", \"" + n + "\"";
  return s;
}

std::optional<PeakFlops> resolve_mfu_peak(const TrainConfig& t, const std::string& device, int threads,
                                          const std::string& gpu_name) {
  if (t.mfu_peak_flops > 0) {
    char figure[64];
    std::snprintf(figure, sizeof figure, "%.6g FLOP/s", t.mfu_peak_flops);
    return PeakFlops{t.mfu_peak == "auto" ? "stated" : t.mfu_peak, t.mfu_peak_flops,
                     std::string("train.mfu_peak_flops = ") + figure};
  }
  if (t.mfu_peak == "cpu" || (t.mfu_peak == "auto" && device == "cpu")) return cpu_peak(detect_cpu(threads));
  if (t.mfu_peak == "auto") return gpu_peak_by_device_name(gpu_name);
  if (auto p = datasheet_peak(t.mfu_peak)) return p;
  throw Error("unknown MFU peak", {.field = "train.mfu_peak", .expected = mfu_peak_choices(), .found = t.mfu_peak});
}

std::optional<PeakFlops> announce_mfu_peak(const RunConfig& cfg, int ranks) {
  std::string gpu;
  if (cfg.parallel.device == "cuda") {
    const std::vector<cuda::DeviceInfo> devs = cuda::devices();
    if (!devs.empty()) gpu = devs[static_cast<size_t>(launcher_local_ranks().rank) % devs.size()].name;
  }
  std::optional<PeakFlops> peak;
  try {
    peak = resolve_mfu_peak(cfg.train, cfg.parallel.device, num_threads(), gpu);
  } catch (const Error& e) {
    log_warn("MFU: ", e.what(), "; metrics.jsonl carries no mfu");
    return std::nullopt;
  }
  if (!peak) {
    log_warn("MFU: no datasheet peak known for the GPU '", gpu, "'; metrics.jsonl carries no mfu. State one with ",
             "train.mfu_peak (", mfu_peak_choices(), ") or train.mfu_peak_flops");
    return std::nullopt;
  }
  char line[256];
  std::snprintf(line, sizeof line, "MFU peak: %s, %.4g TFLOP/s per rank x %d rank%s = %.4g TFLOP/s", peak->name.c_str(),
                peak->flops_per_s / 1e12, ranks, ranks == 1 ? "" : "s", peak->flops_per_s * ranks / 1e12);
  log_info(line, " (", peak->basis, ")");
  peak->flops_per_s *= ranks;
  return peak;
}

}  // namespace zaya::train
