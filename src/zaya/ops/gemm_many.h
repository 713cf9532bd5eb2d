// Independent GEMMs in one call: each problem computed exactly as ops::gemm computes it alone
// (the same bits), with a backend free to run them side by side. The model's deferred weight
// gradients dW += dyᵀ·x use it.
#pragma once

#include <span>

#include "zaya/ops/gemm.h"

namespace zaya::ops {

// Every problem with the same transposes, alpha and beta. Outputs must not overlap each other or
// any input.
void gemm_many(std::span<const GemmProblem> problems, Trans ta, Trans tb, float alpha = 1.0f, float beta = 0.0f);

}  // namespace zaya::ops
