// Newton–Schulz orthogonalization (see newton_schulz.h).
#include "zaya/ops/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "zaya/ops/cpu/op_checks.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops {
namespace {

using detail::require_f32;

double frobenius_squared(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace

void newton_schulz_step(const Tensor& X, const Tensor& X_next, const Tensor& A, const Tensor& B, float a, float b,
                        float c) {
  const char* op = "newton_schulz_step";
  require_f32(op, "X", X);
  ZAYA_CHECK(X.ndim() == 2 && X.size(0) <= X.size(1), op, ": X must be [r, c] with r <= c, found ", X.str());
  int64_t r = X.size(0);
  require_f32(op, "X_next", X_next);
  check_same_shape("newton_schulz_step: X_next vs X", X_next, X);
  require_f32(op, "A", A);
  check_shape("newton_schulz_step: A", A, Shape{r, r});
  require_f32(op, "B", B);
  check_shape("newton_schulz_step: B", B, Shape{r, r});
  gemm(X, Trans::N, X, Trans::T, A);  // A = X·Xᵀ
  const float* ap = A.data<float>();
  float* bp = B.data<float>();
  for (int64_t i = 0; i < r * r; ++i) bp[i] = b * ap[i];
  gemm(A, Trans::N, A, Trans::N, B, c, 1.0f);  // B = b·A + c·A·A
  const float* xp = X.data<float>();
  float* np = X_next.data<float>();
  int64_t n = X.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) np[i] = a * xp[i];
  gemm(B, Trans::N, X, Trans::N, X_next, 1.0f, 1.0f);  // X_next = a·X + B·X
}

int64_t newton_schulz_workspace_elems(int64_t rows, int64_t cols) {
  int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  return 2 * r * c + 2 * r * r;
}

void newton_schulz_orthogonalize(const Tensor& G, const Tensor& out, const Tensor& workspace, int steps) {
  const char* op = "newton_schulz_orthogonalize";
  require_f32(op, "G", G);
  ZAYA_CHECK(G.ndim() == 2, op, ": G must be 2-D, found ", G.str());
  require_f32(op, "out", out);
  check_same_shape("newton_schulz_orthogonalize: out vs G", out, G);
  require_f32(op, "workspace", workspace);
  ZAYA_CHECK(steps >= 0, op, ": steps must be >= 0, found ", steps);
  const int64_t rows = G.size(0), cols = G.size(1);
  const int64_t need = newton_schulz_workspace_elems(rows, cols);
  ZAYA_CHECK(workspace.numel() >= need, op, ": workspace has ", workspace.numel(), " elements, needs ", need,
             " for G ", G.shape().str());
  const bool transpose = rows > cols;
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  Tensor X = workspace.window(0, Shape{r, c});
  Tensor Y = workspace.window(r * c, Shape{r, c});
  Tensor A = workspace.window(2 * r * c, Shape{r, r});
  Tensor B = workspace.window(2 * r * c + r * r, Shape{r, r});

  // X₀ = G/(‖G‖_F + 1e-7): every singular value then lies in [0, 1], where the quintic works.
  const float* g = G.data<float>();
  double fro = std::sqrt(frobenius_squared(g, G.numel()));
  const float inv = static_cast<float>(1.0 / (fro + 1e-7));
  float* x = X.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) x[i * c + j] = (transpose ? g[j * cols + i] : g[i * c + j]) * inv;

  for (int s = 0; s < steps; ++s) {
    newton_schulz_step(X, Y, A, B);
    std::swap(X, Y);
  }
  const float* xs = X.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      if (transpose) o[j * cols + i] = xs[i * c + j];
      else o[i * c + j] = xs[i * c + j];
    }
}

}  // namespace zaya::ops
