// The FMA units' rate on this machine over a chosen length of time, on 1 and then on 2 threads:
// 12 independent AVX-512 FMA chains per thread, nothing from memory. It is the ceiling to read the
// training step's GEMM rates against (docs/results/model-cpu.md). On a shared VM the rate moves with
// the minute, not with the length of the run, so run it beside the measurement it calibrates.
//   build/cuda/tools/fma_sustained_probe [ITERATIONS]   (default 2e8: ~1 s per thread count; 1e9: ~5 s)
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

// 12 chains of ITERATIONS FMAs each on 16 lanes; returns their sum so nothing is optimized away.
__attribute__((target("avx512f,fma"))) float run(long iterations) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  // Summed through memory: GCC 12's _mm512_reduce_add_ps trips its own -Wuninitialized.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  // Built for any x86-64 (the kernel carries its own target), so say so instead of dying on SIGILL.
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "fma_sustained_probe: this CPU has no AVX-512F; the probe measures AVX-512 FMAs\n");
    return 2;
  }
  const long iterations = argc > 1 ? std::atol(argv[1]) : 200000000L;
  for (int threads = 1; threads <= 2; ++threads) {
    std::vector<float> sums(static_cast<size_t>(threads));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { sums[static_cast<size_t>(t)] = run(iterations); });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double flops = static_cast<double>(threads) * static_cast<double>(iterations) * 12 * 16 * 2;
    std::printf("%d thread(s): %.1f GFLOP/s over %.2f s (checksum %g)\n", threads, flops / s * 1e-9, s,
                static_cast<double>(sums[0]));
  }
}
