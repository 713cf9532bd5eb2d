// CPU Newton–Schulz orthogonalization (newton_schulz.h; arguments checked by the fronts in
// ops/newton_schulz.cc). The GEMMs, casts and norms go through the op fronts.
#include "zaya/ops/cpu/newton_schulz_cpu.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/cpu/gemm_onednn.h"
#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::ops::cpu {
namespace {

// scaled = s·src and, when low is defined, low = bf16(src), in one pass over src (both only read it).
// low may be bf16, or f32 holding bf16 values (where gemm would widen bf16 to f32 anyway).
void scale_and_round(const Tensor& src, float s, const Tensor& scaled, const Tensor& low) {
  const float* x = src.data<float>();
  float* y = scaled.data<float>();
  bf16* r = low.defined() && low.dtype() == DType::bf16 ? low.data<bf16>() : nullptr;
  float* rf = low.defined() && low.dtype() == DType::f32 ? low.data<float>() : nullptr;
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    y[i] = s * x[i];
    if (r) r[i] = to_bf16(x[i]);
    if (rf) rf[i] = to_float(to_bf16(x[i]));
  }
}

// dst = bf16(src), stored as bf16 or as f32 holding the bf16 value.
void round_to_bf16(const Tensor& src, const Tensor& dst) {
  if (dst.dtype() == DType::bf16) {
    ops::cast_to_bf16(dst, src);
    return;
  }
  const float* x = src.data<float>();
  float* y = dst.data<float>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = to_float(to_bf16(x[i]));
}

// One quintic step on a batch of matrices X [Bt, r, c] (r <= c), or [Bt, c, r] stored as it is
// when `tall` (its Gram matrix is then Xᵀ·X and the update X·B: the same step on Xᵀ, B being
// symmetric, with no transpose of X). Every GEMM is batched:
//   A = X·Xᵀ,  B = b·A + c·A·A,  X_next = a·X + B·X.
// With bf16 copies (Xb, Ab, Bb defined; Xb already holds bf16(X)) the GEMM inputs are the copies
// and X_next overwrites X (the last GEMM reads only the copies, and adds a·X as its sum post-op);
// Xn is then unused. Without them X_next goes to Xn, starting as a·X. The scaled term b·A is
// written by the pass that rounds A.
void quintic_step(const Tensor& X, const Tensor& Xn, const Tensor& A, const Tensor& B, const Tensor& Xb,
                  const Tensor& Ab, const Tensor& Bb, bool tall, float a = kNewtonSchulzA,
                  float b = kNewtonSchulzB, float c = kNewtonSchulzC) {
  const bool low = Xb.defined();
  const Tensor& x_in = low ? Xb : X;
  const Trans gram_left = tall ? Trans::T : Trans::N, gram_right = tall ? Trans::N : Trans::T;
  ops::gemm(A, x_in, gram_left, x_in, gram_right);                        // A = X·Xᵀ
  scale_and_round(A, b, B, Ab);                                      // B starts as b·A
  ops::gemm(B, low ? Ab : A, Trans::N, low ? Ab : A, Trans::N, c, 1.0f);  // B = b·A + c·A·A
  if (low) round_to_bf16(B, Bb);
  const Tensor& b_in = low ? Bb : B;
  const Tensor& out = low ? X : Xn;
  if (!low) scale_and_round(X, a, Xn, {});  // X_next starts as a·X
  if (tall)
    ops::gemm(out, x_in, Trans::N, b_in, Trans::N, 1.0f, low ? a : 1.0f);  // X_next = a·X + X·B
  else
    ops::gemm(out, b_in, Trans::N, x_in, Trans::N, 1.0f, low ? a : 1.0f);  // X_next = a·X + B·X
}

}  // namespace

void newton_schulz_step(const Tensor& X_next, const Tensor& X, const Tensor& A, const Tensor& B, float a,
                        float b, float c) {
  int64_t r = X.size(0);
  quintic_step(X.reshape({1, r, X.size(1)}), X_next.reshape({1, r, X.size(1)}), A.reshape({1, r, r}),
               B.reshape({1, r, r}), {}, {}, {}, false, a, b, c);
}

// The linear path. A step is X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ; the cubic and quintic terms
// are at most (|b|‖X‖² + c‖X‖⁴)/a of the linear one (Frobenius norms bound the spectral ones).
// While ‖X‖ stays below kLinearNorm, that is < 2^-25, under half an ulp of float: the iteration is
// X₀·a^steps to rounding, and it is computed so. Such a matrix arises when a gradient is all but 0
// for many steps (an expert no token reaches: Muon's momentum decays by β every step), and running
// the GEMMs on it was the slow part: A·A's products fall below float's normal range, which x86
// runs through microcode assists (in f32 compute the demo's gate_up stack of 8 [1024, 256]
// matrices with one at ~1e-20 took 318 instead of ~71 ms: BM_newton_schulz/8/1024/256/1/1;
// docs/results/ops-cpu.md, "Muon: a decayed momentum").
constexpr double kLinearNorm = 1e-4;

void newton_schulz_orthogonalize(const Tensor& out, const Tensor& G, const Tensor& workspace, int steps,
                                 DType compute) {
  const int64_t batch = G.ndim() == 3 ? G.size(0) : 1, rows = G.size(-2), cols = G.size(-1);
  if (batch == 0) return;
  // A tall matrix is iterated as it is stored, its Gram matrix Xᵀ·X on the small side
  // (quintic_step): no transpose in or out.
  const bool tall = rows > cols;
  const int64_t r = std::min(rows, cols), rc = rows * cols, rr = r * r;
  // The iterate X lives in `out`, so the result needs no copy when the last step wrote there.
  Tensor X = out.reshape({batch, rows, cols});
  Tensor A = workspace.window(0, Shape{batch, r, r});
  Tensor B = workspace.window(batch * rr, Shape{batch, r, r});
  Tensor Y, Xb, Ab, Bb;
  if (compute == DType::f32) {
    Y = workspace.window(2 * batch * rr, Shape{batch, rows, cols});
  } else if (!gemm_bf16_native()) {
    // gemm would widen bf16 inputs back to f32 on every call (9% of this function's time on a
    // Zen 3): keep the bf16-rounded inputs in f32 instead, in this thread's scratch.
    thread_local std::vector<float> rounded;
    const size_t need_f = static_cast<size_t>(batch * (rc + 2 * rr));
    if (rounded.size() < need_f) rounded.resize(need_f);
    Xb = Tensor::borrow(rounded.data(), Shape{batch, rows, cols}, DType::f32);
    Ab = Tensor::borrow(rounded.data() + batch * rc, Shape{batch, r, r}, DType::f32);
    Bb = Tensor::borrow(rounded.data() + batch * (rc + rr), Shape{batch, r, r}, DType::f32);
  } else {
    // bf16 copies after the f32 part, 64-byte aligned for the AMX/AVX-512 kernels.
    auto addr = reinterpret_cast<uintptr_t>(workspace.data<float>() + 2 * batch * rr);
    auto* base = reinterpret_cast<bf16*>((addr + 63) & ~uintptr_t{63});
    Xb = Tensor::borrow(base, Shape{batch, rows, cols}, DType::bf16);
    Ab = Tensor::borrow(base + batch * rc, Shape{batch, r, r}, DType::bf16);
    Bb = Tensor::borrow(base + batch * (rc + rr), Shape{batch, r, r}, DType::bf16);
  }

  // X₀ = G/(‖G‖_F + 1e-7) per matrix: every singular value then lies in [0, 1], where the quintic works.
  // A matrix whose X₀ is tiny takes the linear path instead: `linear[e]` = a^steps/(‖G‖_F + 1e-7),
  // and its X₀ is 0 in the iteration (see kLinearNorm).
  std::vector<float> linear(static_cast<size_t>(batch), 0.0f);
  const double growth = std::pow(static_cast<double>(kNewtonSchulzA), steps);  // the linear term's a^steps
  for (int64_t e = 0; e < batch; ++e) {
    const Tensor ge = G.ndim() == 3 ? G.select(e) : G;
    // ‖G‖_F through the optimizer's norm (double accumulation, fixed blocks, vectorized).
    const double norm = ops::global_grad_norm(std::span<const Tensor>(&ge, 1));
    const bool tiny = norm / (norm + 1e-7) * growth < kLinearNorm;  // ‖X₀‖·a^steps
    if (tiny) linear[e] = static_cast<float>(growth / (norm + 1e-7));
    scale_and_round(ge, tiny ? 0.0f : static_cast<float>(1.0 / (norm + 1e-7)), X.select(e), {});
  }
  // With every matrix on the linear path (one alone, as the optimizer's side-by-side loop passes
  // them) there is nothing to iterate: X is 0.
  const bool all_linear = std::all_of(linear.begin(), linear.end(), [](float l) { return l != 0.0f; });
  for (int s = 0; s < steps && !all_linear; ++s) {
    if (Xb.defined()) round_to_bf16(X, Xb);
    quintic_step(X, Y, A, B, Xb, Ab, Bb, tall);
    if (!Xb.defined()) std::swap(X, Y);
  }
  float* o = out.data<float>();
  if (X.data<float>() != o) std::copy_n(X.data<float>(), batch * rc, o);  // f32 with an odd step count
  for (int64_t e = 0; e < batch; ++e) {
    if (linear[e] == 0.0f) continue;
    // The linear path (a zero G gives 0).
    const float* g = G.data<float>() + e * rc;
    const float sc = linear[e];
    float* oe = o + e * rc;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rc; ++i) oe[i] = g[i] * sc;
  }
}

void newton_schulz_orthogonalize_on_this_thread(const Tensor& out, const Tensor& G, const Tensor& workspace,
                                                int steps, DType compute) {
  // Holds this thread's OpenMP team size to one: the passes' parallel loops then run here alone,
  // and gemm builds and runs one-thread primitives (inside a parallel region as outside one). The
  // front checks the arguments and comes back to cpu::newton_schulz_orthogonalize.
  gemm_detail::OneThread one;
  ops::newton_schulz_orthogonalize(out, G, workspace, steps, compute);
}

}  // namespace zaya::ops::cpu
