// "Beyond cache sizes" for the memory-bound benchmarks, and the STREAM triad they are compared to.
//
// STREAM's rule: every array at least 4× the sum of the caches, or the "bandwidth" measured is the
// last-level cache's. That matters here: a VM can report a 300 MiB L3, where 32 MiB tensors are
// L3-resident and the triad runs at L3 speed (30-40 GB/s at 2 threads against ~15 GB/s from DRAM). Sizes are therefore read off the machine at run
// time: per-array bytes = 4 × (L2 per core × cores + L3), capped so that six such arrays (the most
// any benchmark holds) take at most half of physical memory, and rounded to whole rows.
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "zaya/core/cpu_caches.h"
#include "zaya/core/random.h"
#include "zaya/core/tensor.h"

namespace zaya::bench {

inline int64_t sysconf_or(int name, int64_t fallback) {
  long v = sysconf(name);
  return v > 0 ? static_cast<int64_t>(v) : fallback;
}

// Elements of f32 per array, a multiple of `row` (the benchmark's row length).
inline int64_t stream_elems(int64_t row) {
  const int64_t mem = sysconf_or(_SC_PHYS_PAGES, 1 << 20) * sysconf_or(_SC_PAGESIZE, 4096);
  const int64_t bytes = std::min(4 * cpu_cache_bytes(), mem / 12);
  const int64_t rows = std::max<int64_t>(1, (bytes / 4 + row - 1) / row);
  return rows * row;
}

// Records the sizing in the benchmark's JSON/console context, once per binary.
inline const bool kContextRecorded = [] {
  benchmark::AddCustomContext("cache_bytes_l2_total_plus_l3", std::to_string(cpu_cache_bytes()));
  benchmark::AddCustomContext("stream_array_bytes", std::to_string(stream_elems(2048) * 4));
  return true;
}();

// Fills t's first min(numel, 2^20) elements with `fill` and repeats them over the rest, in
// parallel; every page of t is then touched too.
template <class Fill>
void fill_tiled(Tensor& t, Fill fill) {
  const int64_t n = t.numel(), head = std::min<int64_t>(n, int64_t{1} << 20);
  Tensor h = t.window(0, Shape{head});
  fill(h);
  float* p = t.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = head; i < n; i += head) std::copy_n(p, std::min(head, n - i), p + i);
}

// Normal draws (mean 0, std 1) whose first 2^20 repeat over the rest: drawing gigabytes of normals
// takes seconds per tensor, and neither memory-bound ops nor attention care about the repeat.
inline Tensor random_normal(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_tiled(t, [&](Tensor& head) { fill_normal(head, seed, 0, 0.0f, 1.0f); });
  return t;
}

// An output tensor with its pages already faulted in (Tensor::empty's are not), so that the first
// timed iteration does not pay the kernel's page zeroing.
inline Tensor faulted_zeros(const Shape& s) { return Tensor::zeros(s, DType::f32); }

// a = b + s·c over three arrays of n floats, split over the threads like our kernels; 12 bytes per
// element counted (STREAM's convention: the write-allocate read of a is not counted).
inline void stream_triad(benchmark::State& state, int64_t n) {
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  const float s = 3.0f;
  for (auto _ : state) {
    float *ap = a.data(), *bp = b.data(), *cp = c.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) ap[i] = bp[i] + s * cp[i];
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * n * 4);
}

}  // namespace zaya::bench
