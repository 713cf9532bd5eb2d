#include "zaya/bench/membw.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <ostream>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/core/threads.h"

namespace zaya::bench {

uint64_t stream_bytes(StreamKernel k, uint64_t n) {
  const uint64_t arrays = (k == StreamKernel::copy || k == StreamKernel::scale) ? 2 : 3;
  return arrays * sizeof(double) * n;
}

void MembwOptions::validate() const {
  ZAYA_CHECK(min_bytes >= sizeof(double), "--min-bytes must be at least 8 (one double), found ", min_bytes);
  ZAYA_CHECK(min_bytes <= max_bytes, "--min-bytes ", min_bytes, " is larger than --max-bytes ", max_bytes);
  ZAYA_CHECK(factor >= 2, "--factor must be at least 2, found ", factor);
  ZAYA_CHECK(iters >= 1, "-n (iterations) must be at least 1, found ", iters);
  for (int t : threads) ZAYA_CHECK(t >= 1, "--threads entries must be positive, found ", t);
}

std::vector<int> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 4096)
      throw Error("invalid list", {.field = flag, .expected = "comma-separated positive integers like 1,2,4",
                                   .found = "\"" + text + "\""});
    out.push_back(static_cast<int>(v));
  }
  if (out.empty())
    throw Error("empty list", {.field = flag, .expected = "comma-separated positive integers", .found = "\"\""});
  return out;
}

namespace {

struct Free {
  void operator()(double* p) const { std::free(p); }
};
using Array = std::unique_ptr<double[], Free>;
Array alloc(size_t n) {
  void* p = std::aligned_alloc(64, ((n * sizeof(double) + 63) / 64) * 64);
  ZAYA_CHECK(p, "cannot allocate ", n * sizeof(double), " bytes for the membw arrays");
  return Array(static_cast<double*>(p));
}

}  // namespace

std::vector<MembwRow> run_membw(const MembwOptions& o, std::ostream& out) {
  o.validate();
  std::vector<int> threads = o.threads;
  if (threads.empty()) {
    threads = {1};
    if (default_num_threads() > 1) threads.push_back(default_num_threads());
  }
  const double q = 3.0;  // STREAM's scalar
  std::vector<MembwRow> rows;
  char line[256];
  std::snprintf(line, sizeof line, "# %14s  %7s  %10s  %10s  %10s  %10s\n", "array (B)", "threads", "copy GB/s",
                "scale GB/s", "add GB/s", "triad GB/s");
  out << "# zaya bench membw: STREAM kernels on double arrays, best of " << o.iters
      << " iterations; bytes counted as STREAM (copy/scale 16 B, add/triad 24 B per element)\n"
      << line;
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const size_t n = bytes / sizeof(double);
    Array a = alloc(n), b = alloc(n), c = alloc(n);
    for (int nt : threads) {
      // First touch by the same threads that run the kernels, so pages land on their nodes.
#pragma omp parallel for num_threads(nt) schedule(static)
      for (size_t i = 0; i < n; ++i) a[i] = 1.0, b[i] = 2.0, c[i] = 0.0;
      double best[4] = {1e30, 1e30, 1e30, 1e30};
      for (int it = 0; it < o.iters; ++it) {
        double* A = a.get();
        double* B = b.get();
        double* C = c.get();
        auto time = [&](int k, auto&& body) {
          auto t0 = std::chrono::steady_clock::now();
          body();
          best[k] = std::min(best[k], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        };
        // The four STREAM kernels, in STREAM's order; each reads what the previous wrote.
        time(0, [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
          for (size_t i = 0; i < n; ++i) C[i] = A[i];
        });
        time(1, [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
          for (size_t i = 0; i < n; ++i) B[i] = q * C[i];
        });
        time(2, [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
          for (size_t i = 0; i < n; ++i) C[i] = A[i] + B[i];
        });
        time(3, [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
          for (size_t i = 0; i < n; ++i) A[i] = B[i] + q * C[i];
        });
      }
      // STREAM's validation: replay the recurrence on scalars and compare.
      double ea = 1.0, eb = 2.0, ec = 0.0;
      for (int it = 0; it < o.iters; ++it) {
        ec = ea;
        eb = q * ec;
        ec = ea + eb;
        ea = eb + q * ec;
      }
      MembwRow row{.array_bytes = n * sizeof(double), .threads = nt};
      // Relative 1e-13: the recurrence is exact-ish doubles; STREAM itself uses 1e-13 for double.
      for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 1024))
        row.valid &= std::fabs(a[i] - ea) <= 1e-13 * std::fabs(ea) && std::fabs(b[i] - eb) <= 1e-13 * std::fabs(eb) &&
                     std::fabs(c[i] - ec) <= 1e-13 * std::fabs(ec);
      const StreamKernel ks[4] = {StreamKernel::copy, StreamKernel::scale, StreamKernel::add, StreamKernel::triad};
      for (int k = 0; k < 4; ++k) row.gbs[k] = static_cast<double>(stream_bytes(ks[k], n)) / 1e9 / best[k];
      std::snprintf(line, sizeof line, "  %14llu  %7d  %10.2f  %10.2f  %10.2f  %10.2f%s\n",
                    static_cast<unsigned long long>(row.array_bytes), nt, row.gbs[0], row.gbs[1], row.gbs[2],
                    row.gbs[3], row.valid ? "" : "  INVALID");
      out << line;
      out.flush();
      rows.push_back(row);
    }
    if (bytes > o.max_bytes / o.factor) break;  // the next step would overflow past max
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    ZAYA_CHECK(f.good(), "cannot write the JSON file ", o.json_path);
    f << "{\n  \"benchmark\": \"membw\",\n  \"units\": \"GB/s (1e9 bytes), STREAM byte counting\",\n  \"results\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      f << (i ? ",\n" : "\n") << "    {\"array_bytes\": " << r.array_bytes << ", \"threads\": " << r.threads
        << ", \"copy\": " << r.gbs[0] << ", \"scale\": " << r.gbs[1] << ", \"add\": " << r.gbs[2]
        << ", \"triad\": " << r.gbs[3] << ", \"valid\": " << (r.valid ? "true" : "false") << "}";
    }
    f << "\n  ]\n}\n";
    ZAYA_CHECK(f.good(), "error while writing the JSON file ", o.json_path);
  }
  return rows;
}

}  // namespace zaya::bench
