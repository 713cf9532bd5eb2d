// The CPU side of zaya/ops/gemm_many.h.
#pragma once

#include <span>

#include "zaya/ops/gemm.h"

namespace zaya::ops::cpu {

void gemm_many(std::span<const GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta);

}  // namespace zaya::ops::cpu
