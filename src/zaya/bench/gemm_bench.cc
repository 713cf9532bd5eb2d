#include "zaya/bench/gemm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <tuple>

#include "zaya/bench/sysinfo.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/core/tensor.h"
#include "zaya/ops/gemm.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::bench {

std::vector<GemmCase> model_gemm_cases(const model::ModelConfig& c, int64_t tokens, int64_t ref_dim) {
  ZAYA_CHECK(tokens >= 1, "--tokens must be positive, found ", tokens);
  std::vector<GemmCase> out;
  for (const auto& g : sizing::model_gemms(c, tokens))
    out.push_back({g.name + " " + sizing::gemm_pass_name(g.pass), g.m, g.n, g.k, g.count});
  if (ref_dim > 0) out.push_back({"square reference", ref_dim, ref_dim, ref_dim, 1});
  return out;
}

std::vector<GemmCase> sweep_gemm_cases(int64_t lo, int64_t hi) {
  ZAYA_CHECK(lo >= 1 && lo <= hi, "--min-dim/--max-dim must satisfy 1 <= min <= max, found ", lo, " and ", hi);
  std::set<int64_t> squares;
  for (int64_t d = 1; d <= hi; d *= 2)
    if (d >= lo) squares.insert(d);
  for (int64_t d : {96, 192, 768, 1000, 3000})
    if (d >= lo && d <= hi) squares.insert(d);
  std::vector<GemmCase> out;
  for (int64_t d : squares) out.push_back({"square", d, d, d, 1});
  std::vector<int64_t> p4;
  for (int64_t d = 1; d <= hi; d *= 4)
    if (d >= lo) p4.push_back(d);
  for (int64_t m : p4)
    for (int64_t n : p4)
      for (int64_t k : p4)
        if (!(m == n && n == k)) out.push_back({"sweep", m, n, k, 1});
  return out;
}

void GemmBenchOptions::validate() const {
  ZAYA_CHECK(!cases.empty(), "no GEMM shapes to time: give --shapes model:CONFIG or --sweep");
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error("unsupported GEMM dtype", {.field = "--dtype", .expected = "f32 or bf16"});
  if (backend != "cpu" && backend != "cuda")
    throw Error("unknown backend", {.field = "--backend", .expected = "cpu or cuda", .found = backend});
  ZAYA_CHECK(warmup >= 0, "--warmup must be 0 or more, found ", warmup);
  ZAYA_CHECK(repeats >= 1, "--repeats must be at least 1, found ", repeats);
  for (const auto& c : cases)
    ZAYA_CHECK(c.m >= 1 && c.n >= 1 && c.k >= 1, "GEMM dims must be positive, found ", c.m, "x", c.n, "x", c.k);
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// C[M,N] = A[M,K] B[K,N] through ops::gemm (oneDNN), operands random (never zeros: a zero
// operand could take a fast path that real data never takes).
double time_gemm_cpu(const GemmCase& c, DType dt, int warmup, int repeats) {
  Tensor A = Tensor::empty({c.m, c.k}, dt), B = Tensor::empty({c.k, c.n}, dt), C = Tensor::empty({c.m, c.n}, DType::f32);
  fill_uniform(A, 1, 0, -1.f, 1.f);
  fill_uniform(B, 2, 0, -1.f, 1.f);
  for (int i = 0; i < warmup; ++i) ops::gemm(C, A, ops::Trans::N, B, ops::Trans::N);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ops::gemm(C, A, ops::Trans::N, B, ops::Trans::N);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

// --backend cuda needs a build with CUDA and a device: says which is missing.
void require_cuda_device() {
#ifndef ZAYA_HAVE_CUDA
  throw Error("no CUDA device: this build has no CUDA (configure with -DZAYA_CUDA=ON)",
              {.field = "--backend", .found = "cuda"});
#else
  if (cuda::device_count() == 0)
    throw Error("no CUDA device (" + cuda::no_device_reason() + ")", {.field = "--backend", .found = "cuda"});
#endif
}

}  // namespace

std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions& o, std::ostream& out) {
  o.validate();
  if (o.backend == "cuda") require_cuda_device();
  // Model shapes repeat (every layer's projection, forward and backward): time each shape once.
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> timed;
  std::vector<GemmResult> rows;
  for (const auto& c : o.cases) {
    auto key = std::make_tuple(c.m, c.n, c.k);
    auto it = timed.find(key);
    if (it == timed.end()) {
      double s = 0;
#ifdef ZAYA_HAVE_CUDA
      if (o.backend == "cuda") s = time_gemm_cuda(c, o.dtype, o.warmup, o.repeats);
      else
#endif
        s = time_gemm_cpu(c, o.dtype, o.warmup, o.repeats);
      it = timed.emplace(key, s).first;
    }
    GemmResult r{c, it->second, 0};
    r.flops_per_s = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) / r.median_s;
    rows.push_back(r);
  }
  out << format_gemm_table(rows);
  return rows;
}

std::string format_gemm_table(const std::vector<GemmResult>& rows) {
  double best_square = 0;
  for (const auto& r : rows)
    if (r.shape.square()) best_square = std::max(best_square, r.flops_per_s);
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "#%-28s %7s %7s %7s %6s %12s %10s %9s\n", "gemm", "M", "N", "K", "count", "median us",
                "GFLOP/s", "% square");
  o << line;
  for (const auto& r : rows) {
    const auto& c = r.shape;
    std::snprintf(line, sizeof line, " %-28s %7lld %7lld %7lld %6lld %12.1f %10.2f %8.1f%%\n", c.label.c_str(),
                  static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
                  static_cast<long long>(c.count), r.median_s * 1e6, r.flops_per_s / 1e9,
                  best_square > 0 ? 100 * r.flops_per_s / best_square : 0.0);
    o << line;
  }
  if (best_square == 0) o << "# no square GEMM in this run: the % column is empty\n";
  return o.str();
}

sizing::HardwareProfile profile_from_gemm(const std::vector<GemmResult>& rows, DType dtype, sizing::HardwareProfile p,
                                          double peak) {
  double best = 0, best_square = 0;
  p.gemm_table.clear();
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  for (const auto& r : rows) {
    best = std::max(best, r.flops_per_s);
    if (r.shape.square()) best_square = std::max(best_square, r.flops_per_s);
    if (seen.insert({r.shape.m, r.shape.n, r.shape.k}).second)
      p.gemm_table.push_back({r.shape.m, r.shape.n, r.shape.k, r.flops_per_s});
  }
  p.gemm_dtype = dtype == DType::bf16 ? "bf16" : "f32";
  p.achievable_flops = best_square > 0 ? best_square : best;
  if (peak > 0) p.peak_bf16_flops = peak;
  else if (p.peak_bf16_flops <= 0) p.peak_bf16_flops = best;  // no datasheet peak: MFU is then vs the best measured
  return p;
}

double backend_memory_bytes(const std::string& backend) {
  if (backend == "cuda") {
    require_cuda_device();
    return static_cast<double>(cuda::devices().at(0).total_memory);
  }
  return query_sysinfo().memory_gib * 1073741824.0;
}

double membw_from_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open membw JSON", {.file = path});
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("invalid JSON: ") + e.what(), {.file = path});
  }
  if (!j.contains("results") || !j["results"].is_array() || j["results"].empty())
    throw Error("missing results", {.file = path, .field = "results", .expected = "the rows of `zaya bench membw --json`"});
  double largest = 0, rate = 0;
  for (const auto& r : j["results"]) {
    if (!r.contains("array_bytes") || !r.contains("triad") || !r["array_bytes"].is_number() || !r["triad"].is_number())
      throw Error("missing field", {.file = path, .field = "results[].array_bytes/triad", .found = r.dump()});
    const double a = r["array_bytes"].get<double>(), t = r["triad"].get<double>();
    if (a > largest) largest = a, rate = t;
    else if (a == largest) rate = std::max(rate, t);
  }
  return rate * 1e9;  // membw reports GB/s with GB = 1e9 bytes
}

}  // namespace zaya::bench
