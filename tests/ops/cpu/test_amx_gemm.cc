// The AMX bf16 kernel and its packing (zaya/ops/cpu/amx_gemm.h). Packing is checked element by
// element against the layout written out in scalar code; products against float64 sums of the
// same bf16 inputs. Skipped (with the reason) on a CPU without AMX-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/core/philox.h"
#include "zaya/ops/cpu/amx_gemm.h"

namespace zaya::ops::cpu {
namespace {

#define SKIP_WITHOUT_AMX() \
  if (!amx_usable()) GTEST_SKIP() << "this CPU has no AMX-BF16 (or the kernel refused the tile state)"

std::vector<bf16> random_bf16(int64_t n, uint64_t seed) {
  std::vector<bf16> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = to_bf16(2.0f * philox_uniform(seed, static_cast<uint64_t>(i)) - 1.0f);
  return v;
}

// op(X)[k][n] of X row-major [K, N] or, transposed, [N, K]; 0 outside.
float op_at(const std::vector<bf16>& X, int64_t K, int64_t N, bool transposed, int64_t k, int64_t n) {
  if (k >= K || n >= N) return 0.0f;
  return to_float(transposed ? X[n * K + k] : X[k * N + n]);
}

// The calling pattern of ops::gemm_grouped: one OpenMP region of `threads`, every thread loading
// its tile configuration, packing (work-shared, no barrier at its end), a barrier, the product.
template <class Pack, class Multiply>
void pack_then_multiply(int threads, Pack pack, Multiply multiply) {
#pragma omp parallel num_threads(threads)
  {
    amx_tile_begin();
    pack();
#pragma omp barrier
    multiply();
    amx_tile_end();
  }
}

struct PackCase {
  int64_t K, N;
};

TEST(AmxGemm, PackedBHoldsEachPairWhereTheTileExpectsIt) {
  SKIP_WITHOUT_AMX();
  for (PackCase c : {PackCase{32, 16}, PackCase{64, 48}, PackCase{37, 20}, PackCase{5, 3}, PackCase{256, 1024}}) {
    for (bool tr : {false, true}) {
      std::vector<bf16> X = random_bf16(c.K * c.N, 7 + c.K);
      std::vector<bf16> P(static_cast<size_t>(amx_packed_b_elems(c.K, c.N)), bf16{0xffff});
      amx_pack_b(P.data(), X.data(), tr ? c.K : c.N, c.K, c.N, tr);
      const int64_t KB = (c.K + 31) / 32, NB = (c.N + 15) / 16;
      int64_t bad = 0;
      for (int64_t nb = 0; nb < NB; ++nb)
        for (int64_t kb = 0; kb < KB; ++kb)
          for (int64_t kk = 0; kk < 16; ++kk)
            for (int64_t n = 0; n < 16; ++n)
              for (int64_t p = 0; p < 2; ++p) {
                const float want = op_at(X, c.K, c.N, tr, kb * 32 + 2 * kk + p, nb * 16 + n);
                const float got = to_float(P[(nb * KB + kb) * 512 + kk * 32 + n * 2 + p]);
                bad += got != want;
              }
      EXPECT_EQ(bad, 0) << "K " << c.K << " N " << c.N << (tr ? " transposed" : "");
    }
  }
}

TEST(AmxGemm, TransposedAIsXtZeroPaddedInK) {
  SKIP_WITHOUT_AMX();
  for (PackCase c : {PackCase{32, 16}, PackCase{70, 40}, PackCase{3, 5}, PackCase{300, 256}}) {
    const int64_t K = c.K, M = c.N, Kp = (K + 31) / 32 * 32;
    std::vector<bf16> X = random_bf16(K * M, 11 + K);
    std::vector<bf16> At(static_cast<size_t>(M * Kp), bf16{0xffff});
    amx_transpose_a(At.data(), X.data(), M, K, M);
    int64_t bad = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < Kp; ++k) bad += to_float(At[i * Kp + k]) != (k < K ? to_float(X[k * M + i]) : 0.0f);
    EXPECT_EQ(bad, 0) << "K " << K << " M " << M;
  }
}

// C = A·op(B) (+ C0) through packing and the kernel, against float64 sums of the same bf16 values.
// Tolerance: f32 accumulation of Kp products (each exact in f32) errs by at most about
// Kp·2⁻²⁴·Σ|a·b| in the worst case; the check uses 2× that plus 2⁻²⁴·|C0| for the accumulate.
void check_product(int64_t M, int64_t N, int64_t K, bool b_transposed, bool accumulate, int threads) {
  const int64_t Kp = (K + 31) / 32 * 32;
  std::vector<bf16> A0 = random_bf16(M * K, 100 + M), B = random_bf16(K * N, 200 + N);
  std::vector<bf16> A(static_cast<size_t>(M * Kp), bf16{});  // A rows padded with zeros to Kp
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) A[i * Kp + k] = A0[i * K + k];
  std::vector<bf16> P(static_cast<size_t>(amx_packed_b_elems(K, N)));
  std::vector<float> C(static_cast<size_t>(M * N)), C0(C.size());
  for (size_t i = 0; i < C.size(); ++i) C0[i] = C[i] = accumulate ? philox_uniform(300, i) - 0.5f : NAN;
  pack_then_multiply(
      threads, [&] { amx_pack_b(P.data(), B.data(), b_transposed ? K : N, K, N, b_transposed); },
      [&] { amx_gemm(C.data(), N, A.data(), Kp, P.data(), M, N, Kp, accumulate); });
  double worst = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = accumulate ? C0[i * N + j] : 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(to_float(A0[i * K + k])) * op_at(B, K, N, b_transposed, k, j);
        s += p;
        mag += std::fabs(p);
      }
      const double bound = 2.0 * Kp * std::ldexp(mag, -24) + std::ldexp(std::fabs(s), -23) + 1e-30;
      worst = std::max(worst, std::fabs(C[i * N + j] - s) / bound);
    }
  EXPECT_LE(worst, 1.0) << "M " << M << " N " << N << " K " << K << (b_transposed ? " Bt" : "")
                        << (accumulate ? " accumulate" : "");
}

TEST(AmxGemm, ProductsMatchFloat64) {
  SKIP_WITHOUT_AMX();
  for (bool tr : {false, true})
    for (bool acc : {false, true}) {
      check_product(32, 32, 32, tr, acc, 1);
      check_product(77, 48, 64, tr, acc, 2);   // row tail of 13, a 16-column last block
      check_product(5, 16, 96, tr, acc, 2);    // fewer rows than one block
      check_product(130, 256, 256, tr, acc, 2);
      check_product(64, 80, 45, tr, acc, 1);  // K not a multiple of 32 (zero-padded)
      check_product(77, 48, 1056, tr, acc, 2);  // K in chunks of 256 (the last one 32), a row tail
    }
}

// dyᵀ·x as the expert weight gradient runs it: A = transpose of X, B = Y packed by token pairs.
TEST(AmxGemm, WeightGradientFormMatchesFloat64) {
  SKIP_WITHOUT_AMX();
  const int64_t T = 83, M = 48, N = 64, Kp = 96;
  std::vector<bf16> X = random_bf16(T * M, 41), Y = random_bf16(T * N, 42);
  std::vector<bf16> At(static_cast<size_t>(M * Kp)), P(static_cast<size_t>(amx_packed_b_elems(T, N)));
  std::vector<float> C(static_cast<size_t>(M * N), 0.25f);
  pack_then_multiply(
      2,
      [&] {
        amx_transpose_a(At.data(), X.data(), M, T, M);
        amx_pack_b(P.data(), Y.data(), N, T, N, false);
      },
      [&] { amx_gemm(C.data(), N, At.data(), Kp, P.data(), M, N, Kp, true); });
  double worst = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.25, mag = 0.0;
      for (int64_t t = 0; t < T; ++t) {
        const double p = double(to_float(X[t * M + i])) * to_float(Y[t * N + j]);
        s += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(C[i * N + j] - s) / (2.0 * Kp * std::ldexp(mag, -24) + std::ldexp(0.25, -22)));
    }
  EXPECT_LE(worst, 1.0);
}

// Same inputs, 1 and 2 threads: the same bits (each C element has one writer, k in order).
TEST(AmxGemm, BitwiseEqualAcrossThreadCounts) {
  SKIP_WITHOUT_AMX();
  const int64_t M = 100, N = 96, K = 128;
  std::vector<bf16> A = random_bf16(M * K, 51), B = random_bf16(N * K, 52);
  std::vector<bf16> P(static_cast<size_t>(amx_packed_b_elems(K, N)));
  std::vector<float> C1(static_cast<size_t>(M * N)), C2(C1.size());
  for (int threads : {1, 2}) {
    pack_then_multiply(
        threads, [&] { amx_pack_b(P.data(), B.data(), K, K, N, true); },
        [&] { amx_gemm((threads == 1 ? C1 : C2).data(), N, A.data(), K, P.data(), M, N, K, false); });
  }
  EXPECT_EQ(0, std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)));
}

}  // namespace
}  // namespace zaya::ops::cpu
