// One core, the demo experts' weight-gradient products dW (+)= dyᵀ·x (f32, tokens in K): the path
// the fused experts run them on today (ops::gemm_grouped_on_this_thread, oneDNN's runtime-K GEMM)
// against two of zaya's own: the tile product cpu::mm (tile_mm.h) over the tokens in chunks of KC,
// each chunk continuing every element's FMA chain from C, and 16 × 16 tiles on packed k-major
// panels (the fused LM head's backward kernel). Best of 20 calls each, alternated. Also prints how
// far apart oneDNN's and the tiles' results are (0: the same single FMA chain per element).
// Session 23's output and reading: docs/results/model-cpu/dropped-2026-11-27-s23.txt.
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -Isrc tools/tn_wgrad_probe.cc build/cuda/libzaya_ops.a
//       build/cuda/libzaya_core.a -L/usr/local/cuda/lib -Wl,-rpath,/usr/local/cuda/lib -lcudart
//       -ldnnl -lopenblas -o /tmp/tn_wgrad_probe
//   OMP_NUM_THREADS=1 taskset -c 0 /tmp/tn_wgrad_probe [TOKENS]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/ops/cpu/tied_head_cpu.h"
#include "zaya/ops/cpu/tile_mm.h"
#include "zaya/ops/gemm.h"

using namespace zaya;

namespace {

void fill(float* x, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(((i + seed) * 2654435761u) % 1000) / 1000.0f - 0.5f;
}

template <class F>
double best_ms(F&& f) {
  double best = 1e30;
  for (int r = 0; r < 20; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void chunked_mm(float* C, const float* A, const float* B, int64_t m, int64_t n, int64_t k, int64_t kc) {
  for (int64_t k0 = 0; k0 < k; k0 += kc)
    ops::cpu::mm(C, n, A + k0 * m, 1, m, B + k0 * n, n, m, n, std::min(kc, k - k0), true);
}

// Packed panels: Bp[jb][kk][16] = B[kk][16jb + j] (0 past n), then per 16 rows of C the strip
// Ap[kk][16] = A[kk][i0 + r] (0 past m), and 16 x 16 tiles with one B vector and 16 broadcasts per
// kk, each element one FMA chain over kk in order from C.
void tn_tiles(float* C, const float* A, const float* B, int64_t m, int64_t n, int64_t k, bool accumulate) {
  static std::vector<float> bp_store, ap_store;
  const int64_t nb = (n + 15) / 16;
  bp_store.resize(static_cast<size_t>(nb * k * 16 + 16));
  ap_store.resize(static_cast<size_t>(k * 16 + 16));
  float* Bp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(bp_store.data()) + 63) & ~uintptr_t{63});
  float* Ap = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(ap_store.data()) + 63) & ~uintptr_t{63});
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t jb = 0; jb < nb; ++jb) {
      const int64_t left = n - 16 * jb;
      const __mmask16 mk = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      _mm512_store_ps(Bp + (jb * k + kk) * 16, _mm512_maskz_loadu_ps(mk, B + kk * n + 16 * jb));
    }
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    const int64_t rows = std::min<int64_t>(16, m - i0);
    const __mmask16 mr = rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
    for (int64_t kk = 0; kk < k; ++kk)
      _mm512_store_ps(Ap + kk * 16, _mm512_maskz_loadu_ps(mr, A + kk * m + i0));
    for (int64_t jb = 0; jb < nb; ++jb) {
      const int64_t left = n - 16 * jb;
      const __mmask16 mc = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      ops::cpu::tile_panels(C + i0 * n + 16 * jb, n, rows, mc, accumulate, Ap, Bp + jb * k * 16, k);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atol(argv[1]) : 256;
  struct Shape {
    const char* name;
    int64_t m, n;
  } shapes[] = {{"dW_d  (H x I)", 256, 512}, {"dW_gu (2I x H)", 1024, 256}};
  for (const Shape& s : shapes) {
    Tensor A = Tensor::empty({tokens, s.m}, DType::f32), B = Tensor::empty({tokens, s.n}, DType::f32);
    Tensor C1 = Tensor::zeros({s.m, s.n}, DType::f32), C2 = Tensor::zeros({s.m, s.n}, DType::f32);
    fill(A.data<float>(), A.numel(), 1), fill(B.data<float>(), B.numel(), 2);
    const double gflop = 2.0 * s.m * s.n * tokens * 1e-9;
    for (int round = 0; round < 3; ++round) {
      ops::GemmProblem one[1] = {{A, B, C1}};
      const double t_dnnl =
          best_ms([&] { ops::gemm_grouped_on_this_thread(one, ops::Trans::T, ops::Trans::N, 1.0f, 1.0f); });
      std::printf("%s k=%lld  oneDNN %.3f ms %.0f GFLOP/s", s.name, static_cast<long long>(tokens), t_dnnl,
                  gflop / t_dnnl * 1e3);
      for (int64_t kc : {128, 256}) {
        const double t = best_ms(
            [&] { chunked_mm(C2.data<float>(), A.data<float>(), B.data<float>(), s.m, s.n, tokens, kc); });
        std::printf("  | mm kc %lld %.3f ms %.0f GFLOP/s", static_cast<long long>(kc), t, gflop / t * 1e3);
      }
      const double tt = best_ms(
          [&] { tn_tiles(C2.data<float>(), A.data<float>(), B.data<float>(), s.m, s.n, tokens, true); });
      std::printf("  | tiles %.3f ms %.0f GFLOP/s", tt, gflop / tt * 1e3);
      std::printf("\n");
    }
    // One call each from zero: how far apart the two results are (different summation orders).
    std::fill_n(C1.data<float>(), C1.numel(), 0.0f), std::fill_n(C2.data<float>(), C2.numel(), 0.0f);
    ops::GemmProblem one[1] = {{A, B, C1}};
    ops::gemm_grouped_on_this_thread(one, ops::Trans::T, ops::Trans::N, 1.0f, 1.0f);
    tn_tiles(C2.data<float>(), A.data<float>(), B.data<float>(), s.m, s.n, tokens, true);
    double num = 0, den = 0;
    for (int64_t i = 0; i < C1.numel(); ++i) {
      const double d = C1.data<float>()[i] - C2.data<float>()[i];
      num += d * d, den += double(C1.data<float>()[i]) * C1.data<float>()[i];
    }
    std::printf("%s: relative difference of the two results %.2e\n", s.name, std::sqrt(num / den));
  }
  return 0;
}
