#include "zaya/sizing/hardware.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zaya/core/error.h"

namespace zaya::sizing {

std::vector<std::string> builtin_profile_names() { return {"mi300x", "h100", "h200"}; }

HardwareProfile builtin_profile(const std::string& name) {
  // Datasheet peaks; "achievable" is the large bf16 GEMM rate: measured here on H100/H200
  // (≈ 780 TFLOP/s, REFERENCES.md) and, for MI300X, the same ~60% of peak that the paper's
  // GEMM sweeps reach on large shapes.
  if (name == "h100")
    return {"h100", 989e12, 780e12, 80e9, 3.35e12, 450e9, 50e9, 8, "NVIDIA H100 SXM datasheet; NVLink 900 GB/s bidirectional; 400 Gb/s NIC per GPU"};
  if (name == "h200")
    return {"h200", 989e12, 790e12, 141e9, 4.8e12, 450e9, 50e9, 8, "NVIDIA H200 datasheet; NVLink 900 GB/s bidirectional; 400 Gb/s NIC per GPU"};
  if (name == "mi300x")
    return {"mi300x", 1307e12, 780e12, 192e9, 5.3e12, 7 * 48e9, 50e9, 8,
            "AMD MI300X datasheet; 7 xGMI links ~48 GB/s usable each; Pollara 400 NIC per GPU (ZAYA1 cluster)"};
  std::string names;
  for (const auto& n : builtin_profile_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown hardware profile", {.field = "--hw", .expected = names + " or a profile .json", .found = name});
}

HardwareProfile load_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open hardware profile", {.file = path});
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("invalid JSON: ") + e.what(), {.file = path});
  }
  HardwareProfile p;
  auto num = [&](const char* key, double& out, bool required) {
    if (!j.contains(key)) {
      if (required) throw Error("missing field", {.file = path, .field = key});
      return;
    }
    if (!j[key].is_number()) throw Error("wrong type", {.file = path, .field = key, .expected = "a number", .found = j[key].dump()});
    out = j[key].get<double>();
  };
  p.name = j.value("name", path);
  num("peak_bf16_flops", p.peak_bf16_flops, true);
  num("achievable_flops", p.achievable_flops, false);
  if (p.achievable_flops <= 0) p.achievable_flops = p.peak_bf16_flops;
  num("memory_bytes", p.memory_bytes, true);
  num("memory_bandwidth", p.memory_bandwidth, true);
  num("intra_node_bandwidth", p.intra_node_bandwidth, false);
  num("inter_node_bandwidth", p.inter_node_bandwidth, false);
  double g = 8;
  num("gpus_per_node", g, false);
  p.gpus_per_node = static_cast<int>(g);
  p.source = j.value("source", "measured: " + path);
  return p;
}

HardwareProfile resolve_profile(const std::string& s) {
  for (const auto& n : builtin_profile_names())
    if (s == n) return builtin_profile(s);
  if (s.find('/') != std::string::npos || s.find(".json") != std::string::npos) return load_profile(s);
  return builtin_profile(s);  // throws with the list of names
}

}  // namespace zaya::sizing
