// One f32 GEMM shape through ops::gemm on the same operands every call (hot: they stay in cache)
// against 40 operand sets taken in turn (cold: 260 MiB for the default shape, more than this
// machine's share of L3 keeps), medians of 80 calls each, alternated three times. What separates
// the GEMM rates inside the training step from bench_ops_gemm's (docs/results/model-cpu-sessions.md,
// session 15). Default shape: the demo's qkv projection, NT 2048 × 512 × 256.
//   g++ -std=c++20 -O2 -fopenmp -Isrc tools/gemm_cold_probe.cc build/cuda/libzaya_ops.a
//       build/cuda/libzaya_core.a -L/usr/local/cuda/lib -Wl,-rpath,/usr/local/cuda/lib -lcudart -ldnnl
//       -ltomlplusplus -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas -o /tmp/gemm_cold_probe  (one line)
//   OMP_NUM_THREADS=2 /tmp/gemm_cold_probe [M N K]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/ops/gemm.h"

using namespace zaya;

int main(int argc, char** argv) {
  const int64_t M = argc > 3 ? std::atol(argv[1]) : 2048, N = argc > 3 ? std::atol(argv[2]) : 512,
                K = argc > 3 ? std::atol(argv[3]) : 256;
  constexpr int kSets = 40, kCalls = 80;
  std::vector<Tensor> A, W, C;
  for (int i = 0; i < kSets; ++i) {
    A.push_back(Tensor::empty({M, K}, DType::f32));
    W.push_back(Tensor::empty({N, K}, DType::f32));
    C.push_back(Tensor::zeros({M, N}, DType::f32));
    std::fill_n(A.back().data<float>(), M * K, 0.01f);
    std::fill_n(W.back().data<float>(), N * K, 0.02f);
  }
  for (int rep = 0; rep < 3; ++rep)
    for (bool cold : {false, true}) {
      std::vector<double> ts;
      for (int it = 0; it < kCalls; ++it) {
        const int j = cold ? it % kSets : 0;
        const auto t0 = std::chrono::steady_clock::now();
        ops::gemm(A[j], ops::Trans::N, W[j], ops::Trans::T, C[j]);
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ts.begin(), ts.end());
      std::printf("NT %ldx%ldx%ld %s: median %.3f ms, %.1f GFLOP/s\n", static_cast<long>(M), static_cast<long>(N),
                  static_cast<long>(K), cold ? "cold" : "hot ", ts[kCalls / 2] * 1e3,
                  2.0 * M * N * K / ts[kCalls / 2] * 1e-9);
    }
}
