#include "zaya/train/mfu_peak.h"

#include <cstdio>

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

}  // namespace zaya::train
