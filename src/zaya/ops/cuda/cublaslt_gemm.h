// GEMMs through cuBLASLt on the calling thread's device context (its handle, stream and workspace),
// in zaya's row-major terms: C = alpha·op(A)·op(B) + beta·C (+ bias), fp32 accumulation and an f32
// C. A plain C++ header (no CUDA types), for the CUDA kernels of the GEMM, linear, experts and
// Newton–Schulz ops; lt_matmul exists only where the build has CUDA (ZAYA_HAVE_CUDA), lt_mapping
// everywhere (the CPU tests check it).
//
// Precision: f32 inputs run in CUBLAS_COMPUTE_32F (true fp32 products, no TF32), bf16 inputs in
// CUBLAS_COMPUTE_32F with f32 accumulation: the arithmetic of the CPU's GEMMs, in another order.
//
// The matmul descriptor, the three layouts and the algorithm cuBLASLt's heuristic picks are cached
// per thread, keyed by everything the heuristic sees (dims, transposes, batch and strides, dtype,
// the bias epilogue and each operand's pointer alignment): the heuristic runs once per distinct key
// and never again. The experts' GEMMs bring a new row count per expert and step; their keys are
// the few hundred row counts that routing produces, each queried once.
#pragma once

#include <cstdint>
#include <string_view>

#include "zaya/core/dtype.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cuda {

// One strided-batched problem in row-major terms. A is op(A) [m, k] as stored (Trans::N: [m, k],
// Trans::T: [k, m]), B is op(B) [k, n] likewise, C is [m, n]; `batch` problems at element strides
// stride_a, stride_b (> 0) and stride_c. m, n, k > 0.
struct LtProblem {
  int64_t m = 0, n = 0, k = 0;
  Trans ta = Trans::N, tb = Trans::N;
  DType in = DType::f32;  // A's and B's dtype: f32 or bf16
  const void* A = nullptr;
  const void* B = nullptr;
  float* C = nullptr;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  // With a bias (f32 [n], device memory, 16-byte aligned): C = alpha·op(A)·op(B) + beta·C + bias,
  // the bias added to every row (cuBLASLt's BIAS epilogue).
  const float* bias = nullptr;
};

// How a row-major problem is handed to cuBLASLt, which is column-major: row-major C [m, n] is
// column-major Cᵀ [n, m], and Cᵀ = op(B)ᵀ·op(A)ᵀ. So cuBLASLt's A is our B and its B our A, each its
// stored row-major buffer read as column-major (rows = the stored row length, ld = rows), with
// cuBLASLt's transpose flag equal to ours. No operand is copied or transposed.
struct LtLayout {
  int64_t rows, cols, ld;  // column-major, as cublasLtMatrixLayoutCreate takes them
};
struct LtMapping {
  bool trans_a, trans_b;  // cuBLASLt's TRANSA (applies to our B) and TRANSB (to our A)
  LtLayout a, b, c;       // cuBLASLt's A (our B), B (our A), C = D
};
inline LtMapping lt_mapping(int64_t m, int64_t n, int64_t k, Trans ta, Trans tb) {
  const bool tA = ta == Trans::T, tB = tb == Trans::T;
  // our B: [k, n] for N (column-major n × k), [n, k] for T (k × n); our A: [m, k] for N (k × m),
  // [k, m] for T (m × k).
  const LtLayout lb = tB ? LtLayout{k, n, k} : LtLayout{n, k, n};
  const LtLayout la = tA ? LtLayout{m, k, m} : LtLayout{k, m, k};
  return {tB, tA, lb, la, LtLayout{n, m, n}};
}

// Queues the problem on the calling thread's stream and returns true. With a bias for which cuBLASLt
// has no epilogue algorithm, returns false having queued nothing (remembered: asked once per key),
// and the caller adds the bias itself. Throws a zaya::Error naming `op` when cuBLASLt has no
// algorithm for the plain problem or fails.
bool lt_matmul(std::string_view op, const LtProblem& p, float alpha, float beta);

// The number of cached plans on the calling thread (for the tests: a repeated shape adds none).
int64_t lt_plan_count();

}  // namespace zaya::ops::cuda
