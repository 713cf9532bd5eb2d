#include "zaya/sizing/hardware.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

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

double ExpertsPoint::weight_bytes() const {
  const double h = static_cast<double>(hidden), i = static_cast<double>(intermediate);
  return static_cast<double>(experts_hit) * 3.0 * h * i * static_cast<double>(experts_weight_bytes(weight_dtype));
}

int64_t experts_weight_bytes(const std::string& weight_dtype) {
  if (weight_dtype == "f32") return 4;
  if (weight_dtype == "bf16") return 2;
  return 0;
}

namespace {

// The experts_table of a profile JSON; every error names the entry and its field.
std::vector<ExpertsPoint> parse_experts_table(const nlohmann::json& t, const std::string& path) {
  if (!t.is_array())
    throw Error("wrong type", {.file = path, .field = "experts_table", .expected = "an array", .found = t.dump()});
  std::vector<ExpertsPoint> out;
  for (size_t i = 0; i < t.size(); ++i) {
    const auto& e = t[i];
    const std::string where = "experts_table[" + std::to_string(i) + "]";
    if (!e.is_object()) throw Error("wrong type", {.file = path, .field = where, .expected = "an object", .found = e.dump()});
    ExpertsPoint x;
    auto count = [&](const char* key, int64_t& v) {
      if (!e.contains(key) || !e[key].is_number_integer() || e[key].get<int64_t>() < 1)
        throw Error("missing or invalid field", {.file = path, .field = where + "." + key, .expected = "an integer >= 1",
                                                 .found = e.contains(key) ? e[key].dump() : "nothing"});
      v = e[key].get<int64_t>();
    };
    count("tokens", x.tokens);
    count("experts", x.experts);
    count("experts_hit", x.experts_hit);
    count("hidden", x.hidden);
    count("intermediate", x.intermediate);
    if (x.experts_hit > x.experts || x.experts_hit > x.tokens)
      throw Error("invalid experts entry", {.file = path, .field = where + ".experts_hit",
                                            .expected = "at most experts (" + std::to_string(x.experts) + ") and tokens (" +
                                                        std::to_string(x.tokens) + ")",
                                            .found = std::to_string(x.experts_hit)});
    if (!e.contains("weight_dtype") || !e["weight_dtype"].is_string() ||
        experts_weight_bytes(e["weight_dtype"].get<std::string>()) == 0)
      throw Error("missing or invalid field", {.file = path, .field = where + ".weight_dtype", .expected = "\"f32\" or \"bf16\"",
                                               .found = e.contains("weight_dtype") ? e["weight_dtype"].dump() : "nothing"});
    x.weight_dtype = e["weight_dtype"].get<std::string>();
    if (!e.contains("seconds") || !e["seconds"].is_number() || !(e["seconds"].get<double>() > 0))
      throw Error("missing or invalid field", {.file = path, .field = where + ".seconds", .expected = "a number > 0",
                                               .found = e.contains("seconds") ? e["seconds"].dump() : "nothing"});
    x.seconds = e["seconds"].get<double>();
    out.push_back(x);
  }
  return out;
}

}  // namespace

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
  if (j.contains("experts_table")) p.experts_table = parse_experts_table(j["experts_table"], path);
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
  if (!p.experts_table.empty()) {
    nlohmann::json t = nlohmann::json::array();
    for (const auto& x : p.experts_table)
      t.push_back({{"tokens", x.tokens}, {"experts", x.experts}, {"experts_hit", x.experts_hit}, {"hidden", x.hidden},
                   {"intermediate", x.intermediate}, {"weight_dtype", x.weight_dtype}, {"seconds", x.seconds}});
    j["experts_table"] = t;
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

double measured_experts_seconds(const HardwareProfile& p, int64_t experts, int64_t hidden, int64_t intermediate,
                                int64_t weight_bytes, double tokens, double distinct) {
  // Per token count: the mean seconds per hit expert, and the rows per expert it was measured at.
  std::map<double, std::tuple<double, double, int>> by_tokens;  // tokens -> (sum s/hit, sum rows, count)
  for (const auto& x : p.experts_table) {
    if (x.experts != experts || x.hidden != hidden || x.intermediate != intermediate ||
        experts_weight_bytes(x.weight_dtype) != weight_bytes)
      continue;
    auto& [s, rows, n] = by_tokens[static_cast<double>(x.tokens)];
    s += x.seconds / static_cast<double>(x.experts_hit);
    rows += x.rows_per_expert();
    n += 1;
  }
  if (by_tokens.empty() || !(tokens > 0) || !(distinct > 0)) return -1;
  std::vector<std::tuple<double, double, double>> pts;  // (tokens, seconds per hit expert, rows per expert)
  for (const auto& [t, v] : by_tokens) {
    const auto& [s, rows, n] = v;
    pts.push_back({t, s / n, rows / n});
  }
  double per_expert = 0;
  if (tokens <= std::get<0>(pts.front())) {
    per_expert = std::get<1>(pts.front());
  } else if (tokens >= std::get<0>(pts.back())) {
    // Rows per expert as the measurement routes them (round-robin over min(tokens, E)), so the
    // factor is 1 at the largest measured count.
    const auto& [t, s, rows] = pts.back();
    per_expert = s * std::max(1.0, (tokens / std::min(tokens, static_cast<double>(experts))) / rows);
  } else {
    auto hi = std::upper_bound(pts.begin(), pts.end(), tokens, [](double v, const auto& q) { return v < std::get<0>(q); });
    auto lo = hi - 1;
    const double f = std::log(tokens / std::get<0>(*lo)) / std::log(std::get<0>(*hi) / std::get<0>(*lo));
    per_expert = std::get<1>(*lo) + f * (std::get<1>(*hi) - std::get<1>(*lo));
  }
  return distinct * per_expert;
}

HardwareProfile resolve_profile(const std::string& s) {
  for (const auto& n : builtin_profile_names())
    if (s == n) return builtin_profile(s);
  if (s.find('/') != std::string::npos || s.find(".json") != std::string::npos) return load_profile(s);
  return builtin_profile(s);  // throws with the list of names
}

}  // namespace zaya::sizing
