// Muon's Newton–Schulz iteration against float64: one quintic step, and the singular-value band
// after five steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gradcheck.h"
#include "zaya/ops/newton_schulz.h"

namespace zaya::ops {
namespace {

using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;

// Gram matrix of the short side, X·Xᵀ or Xᵀ·X, in double.
Vec gram(const Vec& x, int64_t rows, int64_t cols) {
  bool t = rows > cols;
  int64_t r = t ? cols : rows, c = t ? rows : cols;
  auto at = [&](int64_t i, int64_t j) { return t ? x[j * cols + i] : x[i * cols + j]; };
  Vec g(r * r, 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j)
      for (int64_t k = 0; k < c; ++k) g[i * r + j] += at(i, k) * at(j, k);
  return g;
}

// Eigenvalues of a symmetric matrix by cyclic Jacobi rotations (test-size matrices only).
Vec symmetric_eigenvalues(Vec a, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    if (off < 1e-24) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (std::fabs(a[p * n + q]) < 1e-300) continue;
        double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
        double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  Vec ev(n);
  for (int64_t i = 0; i < n; ++i) ev[i] = a[i * n + i];
  return ev;
}

TEST(NewtonSchulz, OneStepMatchesDouble) {
  const int64_t r = 5, c = 17;
  Tensor X = random_tensor({r, c}, 1, 0.1f);
  Tensor Xn = Tensor::empty({r, c}, DType::f32), A = Tensor::empty({r, r}, DType::f32),
         B = Tensor::empty({r, r}, DType::f32);
  newton_schulz_step(Xn, X, A, B);
  Vec ref = test::newton_schulz_step_f64(to_f64(X), r, c);
  // Three chained f32 GEMMs over <= 17 terms with coefficients ~5: ~1e-6 relative; 1e-5 margin.
  EXPECT_LT(test::rel_error(Xn, ref), 1e-5);
  EXPECT_THROW(newton_schulz_step(X.reshape({c, r}), Xn.reshape({c, r}), A, B), Error);  // r > c
}

TEST(NewtonSchulz, FiveStepsPutSingularValuesInTheQuinticBand) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 48}, {40, 12}, {9, 9}, {1, 5}}) {
    Tensor G = random_tensor({rows, cols}, 7);
    Tensor out = Tensor::empty({rows, cols}, DType::f32);
    Tensor ws = Tensor::empty({newton_schulz_workspace_elems(rows, cols)}, DType::f32);
    newton_schulz_orthogonalize(out, G, ws);
    int64_t r = std::min(rows, cols);
    Vec ev = symmetric_eigenvalues(gram(to_f64(out), rows, cols), r);
    // The quintic f(x) = 3.4445x − 4.7750x³ + 2.0315x⁵ maps [0.68, 1.2025] into itself (its max
    // on [0, 1] is 1.2025 at x = 0.5545, its local min 0.682 at x = 1.05), and five steps lift
    // singular values from the Frobenius-scaled ~0.1 into it. f32 rounding adds ~1e-6; the
    // bounds carry a 0.02 margin. (A square Gaussian G can have a singular value so small that
    // five steps cannot lift it; the fixed seed here gives 9x9 one that they do.)
    double lo = 0.66, hi = 1.22;
    for (double e : ev) {
      double sigma = std::sqrt(std::max(e, 0.0));
      EXPECT_GE(sigma, lo) << rows << "x" << cols;
      EXPECT_LE(sigma, hi) << rows << "x" << cols;
    }
    // The result points the same way as G: <G, out> = Σσ_i(G)·σ_i(out) > 0.
    EXPECT_GT(test::dot(to_f64(G), to_f64(out)), 0.0);
  }
  Tensor G = random_tensor({4, 6}, 1), out = Tensor::empty({4, 6}, DType::f32),
         small = Tensor::empty({3}, DType::f32);
  EXPECT_THROW(newton_schulz_orthogonalize(out, G, small), Error);
}

TEST(NewtonSchulz, BatchedMatchesSeparateAndBf16StaysInTheBand) {
  // A stack of 3 tall matrices (the transpose path), each normalized on its own.
  const int64_t E = 3, rows = 48, cols = 20;
  Tensor G = random_tensor({E, rows, cols}, 11);
  for (int64_t e = 0; e < E; ++e) {  // different norms per matrix
    float* g = G.select(e).data<float>();
    for (int64_t i = 0; i < rows * cols; ++i) g[i] *= static_cast<float>(e + 1) * 10.0f;
  }
  for (DType compute : {DType::f32, DType::bf16}) {
    Tensor out = Tensor::empty({E, rows, cols}, DType::f32);
    Tensor ws = Tensor::empty({newton_schulz_workspace_elems(rows, cols, E, compute)}, DType::f32);
    newton_schulz_orthogonalize(out, G, ws, 5, compute);
    for (int64_t e = 0; e < E; ++e) {
      Tensor one = Tensor::empty({rows, cols}, DType::f32);
      Tensor ws1 = Tensor::empty({newton_schulz_workspace_elems(rows, cols)}, DType::f32);
      newton_schulz_orthogonalize(one, G.select(e).clone(), ws1);
      if (compute == DType::f32) {
        // Batched vs single GEMMs: blocking may differ, so f32 rounding through 5 steps (~1e-6).
        EXPECT_LT(test::rel_error(out.select(e), to_f64(one)), 1e-5) << "matrix " << e;
      } else {
        // bf16 inputs (8 mantissa bits) move the result by ~2.5% (relative norm, measured); the
        // direction stays (cosine measured 0.9996-0.9997, bound 0.99).
        Vec a = to_f64(out.select(e)), b = to_f64(one);
        EXPECT_GT(test::dot(a, b) / std::sqrt(test::dot(a, a) * test::dot(b, b)), 0.99) << "matrix " << e;
      }
      // Both precisions land in the quintic's band [0.68, 1.2025]; bf16 gets a wider margin
      // (0.05: its rounding enters every step's products).
      double margin = compute == DType::f32 ? 0.02 : 0.05;
      Vec ev = symmetric_eigenvalues(gram(to_f64(out.select(e)), rows, cols), cols);
      for (double v : ev) {
        double sigma = std::sqrt(std::max(v, 0.0));
        EXPECT_GE(sigma, 0.68 - margin) << dtype_name(compute) << " matrix " << e;
        EXPECT_LE(sigma, 1.2025 + margin) << dtype_name(compute) << " matrix " << e;
      }
    }
  }
  Tensor out = Tensor::empty({E, rows, cols}, DType::f32);
  for (DType compute : {DType::f32, DType::bf16}) {  // one element short of what it says it needs
    Tensor small = Tensor::empty({newton_schulz_workspace_elems(rows, cols, E, compute) - 1}, DType::f32);
    EXPECT_THROW(newton_schulz_orthogonalize(out, G, small, 5, compute), Error) << dtype_name(compute);
  }
  EXPECT_THROW(newton_schulz_orthogonalize(
                   G, G, Tensor::empty({newton_schulz_workspace_elems(rows, cols, E)}, DType::f32)),
               Error);  // out is the iterate: it must not overlap G
}

// The full iteration in double for one [rows, cols] matrix (transposed when rows > cols, which is
// the same math as the kernel's tall form): X₀ = G/(‖G‖ + 1e-7), then `steps` quintic steps with every term
// (gradcheck.h's).
Vec orthogonalize_f64(const Vec& g, int64_t rows, int64_t cols, int steps) {
  const bool t = rows > cols;
  const int64_t r = t ? cols : rows, c = t ? rows : cols;
  double nrm = 0;
  for (double v : g) nrm += v * v;
  nrm = std::sqrt(nrm);
  Vec x(r * c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) x[i * c + j] = (t ? g[j * cols + i] : g[i * cols + j]) / (nrm + 1e-7);
  for (int s = 0; s < steps; ++s) x = test::newton_schulz_step_f64(x, r, c);
  Vec out(rows * cols);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) (t ? out[j * cols + i] : out[i * cols + j]) = x[i * c + j];
  return out;
}

// A nearly zero G (an expert no token reached: Muon's momentum decays) takes the linear path,
// X₀·a^steps, instead of GEMMs whose products would underflow. It must be what the iteration gives:
// against the double iteration with all its terms, G of norm 1e-14 (X₀ of norm ~1e-7, inside the
// path) and 1e-30, both orientations, batched beside a normal matrix (which must come out as it
// does alone) and beside an all-zero one (which must come out 0). Bound: a handful of float
// roundings, 1e-6 relative.
TEST(NewtonSchulz, NearlyZeroMatricesTakeTheLinearPath) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8, 16}, {16, 8}}) {
    for (float scale : {1e-14f, 1e-30f}) {
      Tensor G = Tensor::empty({3, rows, cols}, DType::f32);
      Tensor tiny = random_tensor({rows, cols}, 5), normal = random_tensor({rows, cols}, 6);
      double tn = 0;
      for (int64_t i = 0; i < tiny.numel(); ++i) tn += double(tiny.data<float>()[i]) * tiny.data<float>()[i];
      const float k = scale / static_cast<float>(std::sqrt(tn));
      for (int64_t i = 0; i < rows * cols; ++i) {
        G.data<float>()[i] = tiny.data<float>()[i] * k;
        G.data<float>()[rows * cols + i] = normal.data<float>()[i];
        G.data<float>()[2 * rows * cols + i] = 0.0f;
      }
      Tensor out = Tensor::empty(G.shape(), DType::f32);
      Tensor ws = Tensor::empty({newton_schulz_workspace_elems(rows, cols, 3)}, DType::f32);
      newton_schulz_orthogonalize(out, G, ws, 5);
      Vec g0 = to_f64(G.select(0)), want = orthogonalize_f64(g0, rows, cols, 5);
      EXPECT_LT(test::rel_error(out.select(0), want), 1e-6) << rows << "x" << cols << " scale " << scale;
      Tensor alone = Tensor::empty({rows, cols}, DType::f32);
      Tensor ws1 = Tensor::empty({newton_schulz_workspace_elems(rows, cols)}, DType::f32);
      newton_schulz_orthogonalize(alone, normal, ws1, 5);
      EXPECT_LT(test::rel_error(out.select(1), to_f64(alone)), 1e-6);
      for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(out.select(2).data<float>()[i], 0.0f);
      // Alone (as the optimizer's side-by-side loop passes a matrix), in both precisions: no
      // iteration runs at all, and the result is the same.
      for (DType compute : {DType::f32, DType::bf16}) {
        Tensor one = Tensor::empty({rows, cols}, DType::f32);
        Tensor ws2 = Tensor::empty({newton_schulz_workspace_elems(rows, cols, 1, compute)}, DType::f32);
        newton_schulz_orthogonalize(one, G.select(0).clone(), ws2, 5, compute);
        EXPECT_LT(test::rel_error(one, want), 1e-6) << rows << "x" << cols << " scale " << scale << " alone";
      }
    }
  }
}

// The Newton–Schulz fronts handed CUDA tensors (host memory labelled CUDA: device_dispatch.h) name
// the argument on another device; where no GPU is present the CUDA kernels (cuda/newton_schulz.cu)
// say so naming the op, before anything is launched (with a GPU, test_optim_cuda.cc runs them).
TEST(NewtonSchulzDevice, MixedDevicesNameTheArgumentAndCudaTensorsNeedAGpu) {
  test::CudaLabelled cu;
  const int64_t r = 4, c = 6;
  Tensor X = cu({r, c}), Xn = cu({r, c}), A = cu({r, r}), B = cu({r, r});
  Tensor G = cu({r, c}), out = cu({r, c}), ws = cu({newton_schulz_workspace_elems(r, c)});
  Tensor ws_cpu = Tensor::zeros({newton_schulz_workspace_elems(r, c)}, DType::f32);
  test::expect_mixed_devices("newton_schulz_orthogonalize", "workspace",
                             [&] { newton_schulz_orthogonalize(out, G, ws_cpu); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_optim_cuda.cc runs these ops on it";
  test::expect_needs_gpu("newton_schulz_step", [&] { newton_schulz_step(Xn, X, A, B); });
  test::expect_needs_gpu("newton_schulz_orthogonalize", [&] { newton_schulz_orthogonalize(out, G, ws); });
}

}  // namespace
}  // namespace zaya::ops
