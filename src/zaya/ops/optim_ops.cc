// Optimizer primitives (see optim_ops.h).
#include "zaya/ops/optim_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "zaya/ops/cpu/op_checks.h"

namespace zaya::ops {
namespace {

using detail::require_f32;

constexpr int64_t kNormBlock = 16384;

// Σ x² of one tensor in double: fixed blocks, block sums combined in block order.
double sum_squares(const float* x, int64_t n) {
  int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  if (blocks <= 1) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  }
  std::vector<double> partial(blocks);  // one small vector per call, outside any per-token loop
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t i0 = b * kNormBlock, i1 = std::min(n, i0 + kNormBlock);
    double s = 0;
    for (int64_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[b] = s;
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace

double global_grad_norm(std::span<const Tensor> grads) {
  double total = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    require_f32("global_grad_norm", str("gradient ", i), grads[i]);
    total += sum_squares(grads[i].data<float>(), grads[i].numel());
  }
  return std::sqrt(total);
}

void scale_inplace(const Tensor& t, float s) {
  require_f32("scale_inplace", "t", t);
  float* p = t.data<float>();
  int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

double clip_grad_norm(std::span<const Tensor> grads, double max_norm) {
  ZAYA_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, found ", max_norm);
  double norm = global_grad_norm(grads);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const Tensor& g : grads) scale_inplace(g, static_cast<float>(coef));
  return norm;
}

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& hp,
                  int64_t step) {
  const char* op = "adamw_update";
  require_f32(op, "param", param);
  for (auto [name, t] : {std::pair{"grad", &grad}, {"m", &m}, {"v", &v}}) {
    require_f32(op, name, *t);
    check_same_shape(str(op, ": ", name, " vs param"), *t, param);
  }
  ZAYA_CHECK(step >= 1, op, ": step must be >= 1 (bias correction divides by 1 - beta^step), found ", step);
  // Bias corrections in double: 1 − 0.95^t loses digits in float for small t.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step)));
  const float b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps, wd = hp.weight_decay;
  float *p = param.data<float>(), *mp = m.data<float>(), *vp = v.data<float>();
  const float* g = grad.data<float>();
  int64_t n = param.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float mi = b1 * mp[i] + (1.0f - b1) * g[i];
    float vi = b2 * vp[i] + (1.0f - b2) * g[i] * g[i];
    mp[i] = mi;
    vp[i] = vi;
    float m_hat = mi / bc1, v_hat = vi / bc2;
    p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
  }
}

}  // namespace zaya::ops
