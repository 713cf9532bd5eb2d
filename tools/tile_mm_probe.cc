// One-core rate of zaya's register-blocked tile product (src/zaya/ops/cpu/tile_mm.h) on a 64³
// product C += A·B, three ways: the 4-row block kernel with every size a compile-time constant,
// the same kernel with the sizes only known at run time, and through mm() (what the attention
// and CCA kernels call). It shows how much of the kernel's rate depends on what GCC can see at
// the call site: the probe behind the tile-kernel notes in docs/results/model-cpu-sessions.md (session 12).
//   g++ -std=c++20 -O3 -DNDEBUG -march=native -fopenmp -Isrc tools/tile_mm_probe.cc -o /tmp/tile_mm_probe
//   taskset -c 1 /tmp/tile_mm_probe
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "zaya/ops/cpu/tile_mm.h"

using namespace zaya::ops::cpu;

namespace {

constexpr int64_t kN = 64;
volatile int64_t g_n = kN;  // read at run time: the compiler cannot fold it

// Rows in blocks of 4 straight into the kernel; n = kN (constant) or g_n (run time).
template <bool Constant>
__attribute__((noinline)) void rows_of_4(float* C, const float* a, const float* B) {
  const int64_t n = Constant ? kN : g_n;
  for (int64_t i = 0; i + 4 <= n; i += 4) tile_detail::mm_rows<4>(C + i * n, n, a + i * n, n, 1, B, n, n, 0, n, true);
}

// As the ops call it: sizes known at run time.
__attribute__((noinline)) void through_mm(float* C, const float* a, const float* B) {
  const int64_t n = g_n;
  mm(C, n, a, n, 1, B, n, n, n, n, true);
}

template <class F>
double gflops(F f) {
  std::vector<float> a(kN * kN, 0.5f), b(kN * kN, 0.25f), c(kN * kN, 0.0f);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const int iters = 20000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) {
      f(c.data(), a.data(), b.data());
      asm volatile("" ::: "memory");
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * kN * kN * kN * iters / s * 1e-9);
  }
  return best;
}

}  // namespace

int main() {
  std::printf("64^3 tile product, one core, best of 5 passes (GFLOP/s)\n");
  std::printf("  4-row blocks, compile-time sizes  %6.1f\n", gflops(rows_of_4<true>));
  std::printf("  4-row blocks, run-time sizes      %6.1f\n", gflops(rows_of_4<false>));
  std::printf("  mm(), run-time sizes              %6.1f\n", gflops(through_mm));
}
