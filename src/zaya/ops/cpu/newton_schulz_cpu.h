// CPU Newton–Schulz behind zaya/ops/newton_schulz.h, and the CPU-only one-thread form.
#pragma once

#include "zaya/ops/newton_schulz.h"

namespace zaya::ops::cpu {

// The kernels of the fronts of the same names (arguments checked there).
void newton_schulz_step(const Tensor& X_next, const Tensor& X, const Tensor& A, const Tensor& B, float a,
                        float b, float c);
void newton_schulz_orthogonalize(const Tensor& out, const Tensor& G, const Tensor& workspace, int steps,
                                 DType compute);

// ops::newton_schulz_orthogonalize (checked there) with every GEMM and pass on the calling thread
// alone, for callers that share whole matrices out among their own threads (the optimizer's Muon
// step, docs/optim.md "Muon's matrices side by side"): a matrix's result then does not depend on
// which thread runs it or on how many there are.
void newton_schulz_orthogonalize_on_this_thread(const Tensor& out, const Tensor& G, const Tensor& workspace,
                                                int steps = 5, DType compute = DType::f32);

}  // namespace zaya::ops::cpu
