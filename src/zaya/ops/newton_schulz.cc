// The Newton–Schulz fronts: argument checks for any device, then the kernel for the tensors' device
// (CPU: cpu/newton_schulz_cpu.cc; CUDA: cuda/newton_schulz.cu).
#include "zaya/ops/newton_schulz.h"

#include <algorithm>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/newton_schulz_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/optim_cuda.h"
#endif

namespace zaya::ops {

void newton_schulz_step(const Tensor& X_next, const Tensor& X, const Tensor& A, const Tensor& B, float a,
                        float b, float c) {
  constexpr std::string_view op = "newton_schulz_step";
  const OpDevice on(op, {{"X", X}, {"X_next", X_next}, {"A", A}, {"B", B}});
  check::f32(op, "X", X);
  ZAYA_CHECK(X.ndim() == 2 && X.size(0) <= X.size(1), op, ": X must be [r, c] with r <= c, found ", X.str());
  const int64_t r = X.size(0);
  check::f32(op, "X_next", X_next);
  check::same_shape(op, "X_next", X_next, "X", X);
  check::f32(op, "A", A);
  check::shape(op, "A", A, Shape{r, r});
  check::f32(op, "B", B);
  check::shape(op, "B", B, Shape{r, r});
  if (on.cpu()) return cpu::newton_schulz_step(X_next, X, A, B, a, b, c);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::newton_schulz_step(X_next, X, A, B, a, b, c);
#endif
  on.no_kernel();
}

int64_t newton_schulz_workspace_elems(int64_t rows, int64_t cols, int64_t batch, DType compute) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  if (compute == DType::bf16)  // A and B, then bf16 copies of X, A and B (+ 16: 64-byte alignment slack)
    return batch * 2 * r * r + (batch * (r * c + 2 * r * r) + 1) / 2 + 16;
  return batch * (r * c + 2 * r * r);  // A, B and the next X
}

void newton_schulz_orthogonalize(const Tensor& out, const Tensor& G, const Tensor& workspace, int steps,
                                 DType compute) {
  constexpr std::string_view op = "newton_schulz_orthogonalize";
  const OpDevice on(op, {{"G", G}, {"out", out}, {"workspace", workspace}});
  check::f32(op, "G", G);
  ZAYA_CHECK(G.ndim() == 2 || G.ndim() == 3, op, ": G must be [rows, cols] or [batch, rows, cols], found ",
             G.str());
  check::f32(op, "out", out);
  check::same_shape(op, "out", out, "G", G);
  {  // out holds the iterate while G is still read (the linear path), so they must be apart
    const auto *g0 = static_cast<const char*>(G.raw()), *o0 = static_cast<const char*>(out.raw());
    ZAYA_CHECK(o0 + out.nbytes() <= g0 || g0 + G.nbytes() <= o0, op, ": out must not overlap G");
  }
  check::f32(op, "workspace", workspace);
  ZAYA_CHECK(steps >= 0, op, ": steps must be >= 0, found ", steps);
  ZAYA_CHECK(compute == DType::f32 || compute == DType::bf16, op,
             ": compute precision must be f32 or bf16, found ", dtype_name(compute));
  const int64_t batch = G.ndim() == 3 ? G.size(0) : 1, rows = G.size(-2), cols = G.size(-1);
  const int64_t need = newton_schulz_workspace_elems(rows, cols, batch, compute);
  ZAYA_CHECK(workspace.numel() >= need, op, ": workspace has ", workspace.numel(), " elements, needs ", need,
             " for G ", G.shape().str(), " in ", dtype_name(compute));
  if (on.cpu()) return cpu::newton_schulz_orthogonalize(out, G, workspace, steps, compute);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::newton_schulz_orthogonalize(out, G, workspace, steps, compute);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
