#include "zaya/sizing/hardware.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/core/peak_flops.h"

namespace zaya::sizing {

std::vector<std::string> builtin_profile_names() { return {"mi300x", "h100", "h200"}; }

HardwareProfile builtin_profile(const std::string& name) {
  // Datasheet peaks; "achievable" is the large bf16 GEMM rate: measured here on H100/H200
  // (≈ 780 TFLOP/s, REFERENCES.md) and, for MI300X, the same ~60% of peak that the paper's
  // GEMM sweeps reach on large shapes.
  // The peaks are core's datasheet table, the one a training run's MFU divides by.
  auto peak = [](const char* n) { return datasheet_peak(n)->flops_per_s; };
  if (name == "h100")
    return {"h100", peak("h100"), 780e12, 80e9, 3.35e12, 450e9, 50e9, 8, "NVIDIA H100 SXM datasheet; NVLink 900 GB/s bidirectional; 400 Gb/s NIC per GPU"};
  if (name == "h200")
    return {"h200", peak("h200"), 790e12, 141e9, 4.8e12, 450e9, 50e9, 8, "NVIDIA H200 datasheet; NVLink 900 GB/s bidirectional; 400 Gb/s NIC per GPU"};
  if (name == "mi300x")
    return {"mi300x", peak("mi300x"), 780e12, 192e9, 5.3e12, 7 * 48e9, 50e9, 8,
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
  p.gemm_dtype = j.value("gemm_dtype", "");
  if (j.contains("gemm_table")) {
    const auto& t = j["gemm_table"];
    if (!t.is_array()) throw Error("wrong type", {.file = path, .field = "gemm_table", .expected = "an array", .found = t.dump()});
    for (size_t i = 0; i < t.size(); ++i) {
      const auto& e = t[i];
      const std::string where = "gemm_table[" + std::to_string(i) + "]";
      GemmPoint g;
      for (const char* key : {"m", "n", "k", "flops_per_s"}) {
        if (!e.is_object() || !e.contains(key) || !e[key].is_number())
          throw Error("missing or non-numeric field", {.file = path, .field = where + "." + key, .expected = "a number",
                                                       .found = e.is_object() && e.contains(key) ? e[key].dump() : "nothing"});
      }
      g.m = e["m"].get<int64_t>();
      g.n = e["n"].get<int64_t>();
      g.k = e["k"].get<int64_t>();
      g.flops_per_s = e["flops_per_s"].get<double>();
      if (g.m < 1 || g.n < 1 || g.k < 1 || !(g.flops_per_s > 0))
        throw Error("invalid GEMM entry", {.file = path, .field = where, .expected = "m, n, k >= 1 and flops_per_s > 0",
                                           .found = e.dump()});
      p.gemm_table.push_back(g);
    }
  }
  return p;
}

std::string profile_to_json(const HardwareProfile& p) {
  nlohmann::json j;
  j["name"] = p.name;
  j["peak_bf16_flops"] = p.peak_bf16_flops;
  j["achievable_flops"] = p.achievable_flops;
  j["memory_bytes"] = p.memory_bytes;
  j["memory_bandwidth"] = p.memory_bandwidth;
  j["intra_node_bandwidth"] = p.intra_node_bandwidth;
  j["inter_node_bandwidth"] = p.inter_node_bandwidth;
  j["gpus_per_node"] = p.gpus_per_node;
  j["source"] = p.source;
  if (!p.gemm_table.empty()) {
    j["gemm_dtype"] = p.gemm_dtype;
    nlohmann::json t = nlohmann::json::array();
    for (const auto& g : p.gemm_table) t.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"flops_per_s", g.flops_per_s}});
    j["gemm_table"] = t;
  }
  return j.dump(2) + "\n";
}

void save_profile(const HardwareProfile& p, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw Error("cannot write hardware profile", {.file = path});
  out << profile_to_json(p);
  if (!out) throw Error("write failed", {.file = path});
}

double gemm_rate(const HardwareProfile& p, int64_t m, int64_t n, int64_t k) {
  if (p.gemm_table.empty()) return p.achievable_flops;
  // Mean rate per distinct size, keyed by log(2MNK).
  std::map<double, std::pair<double, int>> by_size;
  for (const auto& g : p.gemm_table) {
    auto& slot = by_size[std::log(g.flops())];
    slot.first += g.flops_per_s;
    slot.second += 1;
  }
  std::vector<std::pair<double, double>> pts;  // (log size, rate)
  for (const auto& [x, s] : by_size) pts.push_back({x, s.first / s.second});
  const double x = std::log(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  auto hi = std::upper_bound(pts.begin(), pts.end(), x, [](double v, const auto& q) { return v < q.first; });
  auto lo = hi - 1;
  const double t = (x - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

double gemm_rate_at_shape(const HardwareProfile& p, int64_t m, int64_t n, int64_t k) {
  double sum = 0;
  int count = 0;
  for (const auto& g : p.gemm_table)
    if (g.m == m && g.n == n && g.k == k) sum += g.flops_per_s, ++count;
  return count > 0 ? sum / count : gemm_rate(p, m, n, k);
}

HardwareProfile resolve_profile(const std::string& s) {
  for (const auto& n : builtin_profile_names())
    if (s == n) return builtin_profile(s);
  if (s.find('/') != std::string::npos || s.find(".json") != std::string::npos) return load_profile(s);
  return builtin_profile(s);  // throws with the list of names
}

}  // namespace zaya::sizing
