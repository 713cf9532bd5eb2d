// The rate of an FMA register-blocked kernel with its operands in L1: C[MR × 16·NV] += A·B over
// k = 256, A a k-major panel (one broadcast per row and k), B a k-major panel (NV vector loads per
// k), the shape of zaya's tile kernels and of oneDNN's brgemm. It measures what one core can
// do when the data is there: the ceiling the GEMM rates in docs/results/model-cpu.md are read
// against (on 2 Zen 4 cores, 114–117 GFLOP/s per core with both busy: ~230 in all). Run one copy
// per core at once to see the all-core rate.
//   g++ -std=c++20 -O3 -march=native tools/kernel_peak_probe.cc -o /tmp/kernel_peak_probe
//   taskset -c 0 /tmp/kernel_peak_probe & taskset -c 1 /tmp/kernel_peak_probe; wait
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int64_t kK = 256;

template <int MR, int NV>
__attribute__((noinline)) void kernel(const float* __restrict a, const float* __restrict b, float* c, int64_t ldc) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kK; ++k) {
    __m512 bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = _mm512_load_ps(b + k * 16 * NV + 16 * j);
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[k * MR + i]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) {
      float* p = c + i * ldc + 16 * j;
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), acc[i][j]));
    }
}

template <int MR, int NV>
void run() {
  auto* a = static_cast<float*>(std::aligned_alloc(64, kK * MR * 4));
  auto* b = static_cast<float*>(std::aligned_alloc(64, kK * 16 * NV * 4));
  auto* c = static_cast<float*>(std::aligned_alloc(64, MR * 16 * NV * 4));
  for (int64_t i = 0; i < kK * MR; ++i) a[i] = 0.001f * static_cast<float>(i % 7);
  for (int64_t i = 0; i < kK * 16 * NV; ++i) b[i] = 0.001f * static_cast<float>(i % 5);
  std::memset(c, 0, MR * 16 * NV * 4);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const int iters = 20000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) kernel<MR, NV>(a, b, c, 16 * NV);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * MR * 16 * NV * kK * iters / s * 1e-9);
  }
  std::printf("MR %2d x NR %2d: %6.1f GFLOP/s (one core, best of 5)\n", MR, 16 * NV, best);
  std::free(a);
  std::free(b);
  std::free(c);
}

}  // namespace

int main() {
  run<16, 1>();  // zaya's fused-head tile
  run<14, 2>();
  run<6, 4>();
  run<4, 4>();  // tile_mm.h's AVX-512 block
}
