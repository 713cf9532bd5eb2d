// The FMA units' rate on this machine over a chosen length of time, on 1 and then on 2 threads:
// 12 independent AVX-512 FMA chains per thread, nothing from memory. On the shared 2-vCPU VM the
// rate moves with the minute, not with the length of the run (session 22: 149–165 GFLOP/s on one
// thread, 275–328 on two, over 0.5 s and 2.5 s alike; docs/results/model-cpu-sessions.md): the ceiling to
// read the step's GEMM rates against. Compare tools/kernel_peak_probe.cc (a GEMM-shaped
// kernel with its operands in L1).
//   g++ -O2 -mavx512f -mfma tools/fma_sustained_probe.cc -o /tmp/fma_sustained_probe -pthread
//   /tmp/fma_sustained_probe [ITERATIONS]      (default 2e8: ~1 s per thread count; 1e9: ~5 s)
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

// 12 chains of ITERATIONS FMAs each on 16 lanes; returns their sum so nothing is optimized away.
float run(long iterations) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace

int main(int argc, char** argv) {
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
