// GEMM: C = alpha·op(A)·op(B) + beta·C.
//
// A and B are f32, or both bf16 (f32 accumulation, f32 output). C is always f32. beta != 0
// accumulates into C. On the CPU these run through oneDNN matmul with cached primitives, zaya's AMX
// kernel and fixed thread plans (cpu/gemm_cpu.h has the CPU-only switches and the GEMM time
// counters; docs/ops-gemm.md).
#pragma once

#include <cstdint>
#include <span>

#include "zaya/core/tensor.h"

namespace zaya::ops {

enum class Trans : uint8_t { N, T };

// op(A) is [M, K]: A is [M, K] for Trans::N and [K, M] for Trans::T; likewise op(B) is [K, N].
// Batched: A and C may carry a leading batch dim [Bt, ., .]; B is then [Bt, ., .] or 2-D (the same
// B for every batch entry). C must not overlap A or B. C is a view handle: its data is written.
void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha = 1.0f,
          float beta = 0.0f);

// One problem of a grouped GEMM (the expert GEMMs: each expert gets a different number of tokens).
struct GemmProblem {
  Tensor A;
  Tensor B;
  Tensor C;
};

// Runs every problem with the same transposes, alpha and beta; problems may have M = 0 (an expert
// that received no tokens), in which case nothing is touched.
void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha = 1.0f, float beta = 0.0f);

}  // namespace zaya::ops
