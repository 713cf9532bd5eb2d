// bf16 GEMMs on the AMX tile unit, for the grouped expert GEMMs (ops::gemm_grouped).
//
// Why hand-written: oneDNN 2.6 (Debian's) builds its AMX matmul for one fixed M, and the expert
// GEMMs see a new token count per expert and step; its runtime-M path does not use AMX
// (docs/results/ops-cpu.md). Here the token count is a loop bound, so any M costs nothing extra.
//
// The tile unit computes C[16, 16] += A[16, 32]·B[32, 16] per instruction (TDPBF16PS: bf16
// products, exact in f32, summed in f32). A tile is 16 rows of 32 consecutive k of a row-major A;
// B must be "VNNI-packed": row kk of a B tile holds, for each of its 16 columns n, the pair
// (B[2kk][n], B[2kk+1][n]). Every product here is therefore
//     C[M, N] (+)= A[M, Kp]·B[Kp, N],  A row-major bf16, B packed, Kp a multiple of 32,
// and the three expert GEMM forms reach it by packing:
//     x·Wᵀ  (forward, ta = N, tb = T): A = x as it is,  B = Wᵀ packed from W's rows (a 32-bit transpose)
//     dy·W  (input gradient, N, N):    A = dy as it is, B = W packed by interleaving row pairs
//     dyᵀ·x (weight gradient, T, N):   A = dyᵀ (a transpose), B = x packed by interleaving token pairs
// Each C element is summed by one thread in k order, so results do not depend on the thread count.
//
// Parallelism: the functions below are orphaned `omp for ... nowait` loops. Called inside an
// OpenMP region, every thread of it must call them and they share the work; they end WITHOUT a
// barrier, so independent calls (the packing of several experts, the products of several
// experts) run back to back, and the caller puts `#pragma omp barrier` between phases that depend
// on each other (pack → multiply, multiply → reuse of a packing buffer). Outside a region they
// run serially, and so they do inside one when called with whole = true (each thread then runs
// calls of its own: the grouped GEMMs' side-by-side mode).
#pragma once

#include <cstdint>

#include "zaya/core/dtype.h"

namespace zaya::ops::cpu {

// True when the CPU has AMX-BF16 and the kernel granted this process the tile state (asked once).
bool amx_usable();

// Elements of a packed B for a [K, N] operand: K rounded up to 32, N to 16.
int64_t amx_packed_b_elems(int64_t K, int64_t N);

// B = op(X) for X row-major with leading dim ld: X is [K, N] (transposed = false) or [N, K]
// (transposed = true, op(X) = Xᵀ). Zero-padded to whole tiles.
void amx_pack_b(bf16* out, const bf16* X, int64_t ld, int64_t K, int64_t N, bool transposed, bool whole = false);

// At[M, Kp] = Xᵀ for X [K, M] row-major (ld): the A operand of dyᵀ·x, zero-padded in k to Kp =
// K rounded up to 32.
void amx_transpose_a(bf16* out, const bf16* X, int64_t ld, int64_t K, int64_t M, bool whole = false);

// C[M, N] (ldc) = A·B, or += when accumulate; A [M, Kp] row-major bf16 (lda), B packed for
// [Kp, N], N a multiple of 16. Must run on threads that called amx_tile_begin() first.
void amx_gemm(float* C, int64_t ldc, const bf16* A, int64_t lda, const bf16* Bp, int64_t M, int64_t N,
              int64_t Kp, bool accumulate, bool whole = false);

// Loads / releases this thread's tile configuration (all eight tiles 16 rows × 64 bytes).
void amx_tile_begin();
void amx_tile_end();

}  // namespace zaya::ops::cpu
