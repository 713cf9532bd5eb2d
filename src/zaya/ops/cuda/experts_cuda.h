// CUDA kernels behind zaya/ops/experts.h (experts.cu), with the fronts' signatures (the backward
// without side tasks: it runs none and returns false, and the caller runs them). A plain C++ header
// (no CUDA types), included only where the build has CUDA (ZAYA_HAVE_CUDA).
//
// One cuBLASLt GEMM per expert with tokens (cublaslt_gemm.h), in the weights' precision (f32, or
// bf16 inputs with f32 accumulation); offsets are read on the host once per call.
#pragma once

#include <cstdint>

#include "zaya/ops/experts.h"

namespace zaya::ops::cuda {

// A src entry outside [0, N) makes its row of xp NaN (the CPU's gather throws naming it).
void experts_forward(const ExpertActs& a, const Tensor& x, const Tensor& src, const Tensor& offsets,
                     const ExpertWeights& w, int64_t M);
bool experts_backward(const Tensor& dxp, const ExpertWeights& grads, const Tensor& dy, const Tensor& offsets,
                      const ExpertWeights& w, const ExpertActs& a, const ExpertScratch& scratch, int64_t M);

}  // namespace zaya::ops::cuda
