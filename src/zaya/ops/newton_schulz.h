// The Newton–Schulz quintic iteration that Muon uses to orthogonalize an update (replace G = U·S·Vᵀ
// by ≈ U·Vᵀ). f32 tensors.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// Muon's quintic coefficients (Keller Jordan's): they push every singular value of a matrix with
// ‖X‖₂ <= 1 into roughly [0.7, 1.2] in five steps instead of converging to exactly 1.
constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f, kNewtonSchulzC = 2.0315f;

// One step for X [r, c] with r <= c: A = X·Xᵀ, B = b·A + c·A·A, X_next = a·X + B·X.
// A and B are [r, r] workspaces; X_next must not overlap X.
void newton_schulz_step(const Tensor& X_next, const Tensor& X, const Tensor& A, const Tensor& B,
                        float a = kNewtonSchulzA, float b = kNewtonSchulzB, float c = kNewtonSchulzC);

// f32 elements newton_schulz_orthogonalize needs for `batch` [rows, cols] matrices iterated in
// `compute` precision (f32 or bf16), with r = min(rows, cols), c = max(rows, cols): for f32
// batch·(r·c + 2·r²) (the next iterate, A and B); for bf16 batch·2·r² plus room for bf16 copies of
// X, A and B (half of batch·(r·c + 2·r²) f32 elements, + 16 for alignment).
int64_t newton_schulz_workspace_elems(int64_t rows, int64_t cols, int64_t batch = 1,
                                      DType compute = DType::f32);

// out ≈ U·Vᵀ for G = U·S·Vᵀ: X₀ = G/(‖G‖_F + 1e-7), then `steps` quintic steps, iterated in `out`
// (which must not overlap G). A tall matrix (rows > cols) is iterated as it is stored, with its
// Gram matrix Xᵀ·X on the small side and the update X·B: the same steps as on Xᵀ, with no
// transposes. A matrix so small that
// ‖X₀‖·a^steps < 1e-4 (a nearly zero gradient) gets X₀·a^steps: what the steps give to float
// rounding, without GEMMs on values that underflow (cpu/newton_schulz_cpu.cc, kLinearNorm). G and out are
// [rows, cols], or [batch, rows, cols]: then every matrix is normalized and orthogonalized on its own (MoE
// experts are separate functions), with batched GEMMs so that small matrices still fill the cores.
//
// compute = bf16 runs the three GEMMs of each step with bf16 inputs and f32 accumulation, as
// Muon's reference implementation does (it iterates entirely in bfloat16); X itself is kept in
// f32 between steps (the step's last GEMM adds a·X to B·X as it writes X). The quintic is a
// contraction onto a band of singular values, not an exact
// iteration, so bf16 rounding of its inputs moves the result by ~2.5% (relative norm) and not
// its direction (cosine 0.9996 with the f32 result; tests/ops/test_newton_schulz.cc). f32 is the
// exact-arithmetic reference the tests compare against.
void newton_schulz_orthogonalize(const Tensor& out, const Tensor& G, const Tensor& workspace, int steps = 5,
                                 DType compute = DType::f32);

}  // namespace zaya::ops
