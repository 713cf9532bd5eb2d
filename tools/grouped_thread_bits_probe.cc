// Whether a product's bits depend on the thread count: each x·Wᵀ (NT) and dy·W (NN) product of a
// grid of shapes runs on 1 and on 2 threads, and the token counts M at which the two results
// differ are printed per shape. Modes: `grouped` (the default: f32 through ops::gemm_grouped as a
// single problem), `plain` (f32 through ops::gemm), `bf16` (bf16 operands through gemm_grouped),
// `wgrad` (the weight gradient dW[K, N] += dyᵀ·x through gemm_grouped, the tokens M in the reduction).
// `pieces` instead compares, on one thread, a product with its row pieces (the one-thread
// runtime-M kernel through gemm_grouped_on_this_thread, as the model's fused experts run it) and
// prints the piece sizes whose rows came out different from the whole product's.
// Session 24 found with it that oneDNN's threading of the grouped calls' runtime-M kernel changed the bits
// (x·Wᵀ with K ≥ 1024 and a small weight at every M ≥ 16, a one-row dy·W) where the fixed-shape primitives of
// gemm() did not; run_grouped_problem now runs such products as one-thread row pieces (docs/ops-gemm.md,
// docs/results/model-cpu/determinism-2026-11-27-s24.txt).
//
// Build (one line; from the repository root, after cmake --build build/cuda):
//   g++ -std=c++20 -O2 -march=native -fopenmp -Isrc tools/grouped_thread_bits_probe.cc
//       build/cuda/libzaya_ops.a build/cuda/libzaya_core.a -L/usr/local/cuda/lib
//       -Wl,-rpath,/usr/local/cuda/lib -lcudart -lcublasLt -lcublas -ltomlplusplus -ldnnl -lopenblas
//       -o /tmp/grouped_thread_bits_probe
//   /tmp/grouped_thread_bits_probe [grouped|plain|bf16|wgrad|pieces]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/core/threads.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"

using namespace zaya;
using namespace zaya::ops;

namespace {

void fill(const Tensor& t, unsigned seed) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>(((static_cast<unsigned>(i) * 2654435761u + seed * 97u) >> 7) % 2001) / 1000.0f -
           1.0f;
}

enum class Mode { grouped, plain, bf16, wgrad };

Tensor filled(const Shape& shape, unsigned seed, bool bf) {
  Tensor f = Tensor::empty(shape, DType::f32);
  fill(f, seed);
  if (!bf) return f;
  Tensor b = Tensor::empty(shape, DType::bf16);
  cast_to_bf16(f, b);
  return b;
}

// On `threads` threads: C[m, n] = A·op(B), A [m, k], op(B) [k, n]; or for wgrad C[k, n] += Aᵀ·X
// with A [m, k], X [m, n].
std::vector<float> product(Mode mode, int threads, int64_t m, int64_t k, int64_t n, Trans tb) {
  set_num_threads(threads);
  const bool bf = mode == Mode::bf16;
  Tensor A = filled({m, k}, 1, bf);
  if (mode == Mode::wgrad) {
    Tensor X = filled({m, n}, 7, false), C = Tensor::zeros({k, n}, DType::f32);
    std::vector<GemmProblem> one{{A, X, C}};
    gemm_grouped(one, Trans::T, Trans::N, 1.0f, 1.0f);
    return {C.data<float>(), C.data<float>() + C.numel()};
  }
  Tensor B = filled(tb == Trans::T ? Shape{n, k} : Shape{k, n}, 7, bf), C = Tensor::empty({m, n}, DType::f32);
  if (mode == Mode::plain) {
    gemm(A, Trans::N, B, tb, C);
  } else {
    std::vector<GemmProblem> one{{A, B, C}};
    gemm_grouped(one, Trans::N, tb);
  }
  return {C.data<float>(), C.data<float>() + C.numel()};
}

}  // namespace

// Whole against pieces of `chunk` rows (the last one the rest), on one thread, x·Wᵀ.
bool pieces_match(int64_t m, int64_t k, int64_t n, int64_t chunk) {
  set_num_threads(1);
  Tensor A = filled({m, k}, 1, false), B = filled({n, k}, 7, false);
  Tensor whole = Tensor::empty({m, n}, DType::f32), cut = Tensor::empty({m, n}, DType::f32);
  GemmProblem one[1] = {{A, B, whole}};
  gemm_grouped_on_this_thread(one, Trans::N, Trans::T);
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t r1 = std::min(m, r0 + chunk);
    GemmProblem piece[1] = {{A.slice(r0, r1), B, cut.slice(r0, r1)}};
    gemm_grouped_on_this_thread(piece, Trans::N, Trans::T);
  }
  return std::memcmp(whole.raw(), cut.raw(), whole.nbytes()) == 0;
}

int main(int argc, char** argv) {
  const std::string name = argc < 2 ? "grouped" : argv[1];
  if (name == "pieces") {
    for (auto [k, n] : {std::pair<int64_t, int64_t>{256, 1024}, {512, 256}})
      for (int64_t m : {465, 381, 256, 228, 151, 107})
        for (int64_t chunk : {64, 96, 128})
          std::printf("pieces NT K%-4lld N%-5lld M %-4lld in %lld-row pieces (last %lld): %s\n",
                      static_cast<long long>(k), static_cast<long long>(n), static_cast<long long>(m),
                      static_cast<long long>(chunk), static_cast<long long>(m % chunk ? m % chunk : chunk),
                      pieces_match(m, k, n, chunk) ? "same" : "DIFFER");
    return 0;
  }
  const Mode mode = name == "plain"   ? Mode::plain
                    : name == "bf16"  ? Mode::bf16
                    : name == "wgrad" ? Mode::wgrad
                                      : Mode::grouped;
  for (Trans tb : {Trans::T, Trans::N}) {
    if (mode == Mode::wgrad && tb == Trans::N) break;  // one form: dyᵀ·x
    for (int64_t k : {512, 1024, 2048, 4096})
      for (int64_t n : {64, 128, 256, 512, 1024}) {
        std::printf("%s %s K%-5lld N%-5lld differ at M:", name.c_str(),
                    mode == Mode::wgrad ? "TN"
                    : tb == Trans::T    ? "NT"
                                        : "NN",
                    static_cast<long long>(k), static_cast<long long>(n));
        for (int64_t m : {1, 4, 16, 40, 64, 100, 256, 700, 2048}) {
          const std::vector<float> one = product(mode, 1, m, k, n, tb), two = product(mode, 2, m, k, n, tb);
          if (std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) != 0)
            std::printf(" %lld", static_cast<long long>(m));
        }
        std::printf("\n");
      }
  }
  return 0;
}
