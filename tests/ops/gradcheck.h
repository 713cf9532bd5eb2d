// Helpers for op tests: random inputs, float64 references and central finite differences.
//
// The recipe (docs/CONTRIBUTING.md, "Adding an op"): write the op's math again in double in the
// test; compare our float32 forward to it; define a scalar loss L = sum(g ⊙ f(x)) with a random
// cotangent g, take dL/dx by central differences of the double reference (eps 1e-6 gives ~1e-9
// relative truncation + rounding error in double, far below float32's ~1e-7 per-op rounding),
// and compare to our backward given dy = g.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "zaya/core/random.h"
#include "zaya/core/tensor.h"

namespace zaya::test {

// Normal(0, scale) entries shifted away from zero: |x| >= 0.05*scale, so no op sees exact zeros.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, float scale = 1.0f, DType dtype = DType::f32) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill_normal(t, seed, 0, 0.0f, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::fabs(p[i]) < 0.05f * scale) p[i] = (p[i] < 0 ? -0.05f : 0.05f) * scale;
  if (dtype == DType::f32) return t;
  Tensor b = Tensor::empty(shape, DType::bf16);
  for (int64_t i = 0; i < t.numel(); ++i) b.data<bf16>()[i] = to_bf16(p[i]);
  return b;
}

inline std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = t.data<float>()[i];
  } else if (t.dtype() == DType::bf16) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = to_float(t.data<bf16>()[i]);
  } else if (t.dtype() == DType::i32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = t.data<int32_t>()[i];
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(t.data<int64_t>()[i]);
  }
  return out;
}

// ||a - b|| / ||b|| (with ||b|| floored at 1e-30 so an all-zero reference reports the raw norm).
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
inline double rel_error(const Tensor& a, const std::vector<double>& b) { return rel_error(to_f64(a), b); }

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// dL/dx of a scalar function of a double vector, by central differences.
inline std::vector<double> numerical_gradient(const std::function<double(const std::vector<double>&)>& loss,
                                              std::vector<double> x, double eps = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double orig = x[i];
    double h = eps * std::max(1.0, std::fabs(orig));
    x[i] = orig + h;
    double up = loss(x);
    x[i] = orig - h;
    double down = loss(x);
    x[i] = orig;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// One Newton–Schulz quintic step in float64 on X [r, c] (r <= c), Muon's coefficients:
// A = X·Xᵀ, B = b·A + c·A·A, returns a·X + B·X. The reference for the op and for Muon.
inline std::vector<double> newton_schulz_step_f64(const std::vector<double>& X, int64_t r, int64_t c) {
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  std::vector<double> A(r * r, 0.0), B(r * r, 0.0), Y(r * c, 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < c; ++j) A[i * r + k] += X[i * c + j] * X[k * c + j];
  for (int64_t i = 0; i < r; ++i)
    for (int64_t k = 0; k < r; ++k) {
      double aa = 0;
      for (int64_t j = 0; j < r; ++j) aa += A[i * r + j] * A[j * r + k];
      B[i * r + k] = b * A[i * r + k] + cc * aa;
    }
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      double bx = 0;
      for (int64_t k = 0; k < r; ++k) bx += B[i * r + k] * X[k * c + j];
      Y[i * c + j] = a * X[i * c + j] + bx;
    }
  return Y;
}

}  // namespace zaya::test
