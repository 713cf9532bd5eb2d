// CUDA kernels behind zaya/ops/gemm.h, gemm_many.h and dense.h's linear ops (gemm.cu), with the
// fronts' signatures; the fronts check the arguments and call these for CUDA tensors. A plain C++
// header (no CUDA types), included only where the build has CUDA (ZAYA_HAVE_CUDA).
//
// Every GEMM is one cuBLASLt matmul (cublaslt_gemm.h: fp32 compute, no TF32; bf16 inputs with fp32
// accumulation) on the calling thread's stream; nothing synchronizes with the host.
#pragma once

#include <span>

#include "zaya/core/tensor.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/gemm_checks.h"

namespace zaya::ops::cuda {

// C = alpha·op(A)·op(B) + beta·C for dims the front checked. A batched A with a 2-D B is one
// matmul over the stacked rows for Trans::N, else one per batch entry. k = 0 gives C = beta·C
// (exactly 0 for beta = 0, as on the CPU).
void gemm(const GemmDims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha,
          float beta);
// One matmul per problem with rows, in order on the stream (problems with M = 0 are skipped).
void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta);
// Each problem through the ops::gemm front, in order (the GPU runs one large GEMM at a time well;
// the bits are each problem's alone, as gemm_many promises).
void gemm_many(std::span<const GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta);

// y = x·Wᵀ + b: one matmul with cuBLASLt's bias epilogue when b is 16-byte aligned, else the
// matmul and a bias pass.
void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b);
// dx = dy·W (or += with accumulate_dx), dW += dyᵀ·x, db += Σ_rows dy (deterministic column sums,
// ops/cuda/launch.cuh). On the bf16 path dy is first rounded into dy_bf16 (ops::cast_to_bf16).
void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx);

}  // namespace zaya::ops::cuda
