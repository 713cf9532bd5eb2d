#include "zaya/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "zaya/ops/newton_schulz.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::optim {

float muon_scale(int64_t rows, int64_t cols) {
  return static_cast<float>(0.2 * std::sqrt(static_cast<double>(std::max(rows, cols))));
}

int64_t muon_scratch_elems(int64_t rows, int64_t cols, int64_t count, DType ns_dtype) {
  return count * rows * cols + ops::newton_schulz_workspace_elems(rows, cols, count, ns_dtype);
}

void muon_update_stack(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
                       const MuonHyper& hp) {
  ZAYA_CHECK(param.ndim() == 2 || param.ndim() == 3,
             "muon_update: param must be [r, c] or an [E, r, c] stack, found ", param.str());
  check_dtype("muon_update: param", param, DType::f32);
  check_dtype("muon_update: grad", grad, DType::f32);
  check_dtype("muon_update: momentum", m, DType::f32);
  check_dtype("muon_update: scratch", scratch, DType::f32);
  check_same_shape("muon_update: grad vs param", grad, param);
  check_same_shape("muon_update: momentum vs param", m, param);
  const int64_t count = param.ndim() == 3 ? param.size(0) : 1;
  const int64_t rows = param.size(-2), cols = param.size(-1), n = param.numel();
  const int64_t need = muon_scratch_elems(rows, cols, count, hp.ns_dtype);
  ZAYA_CHECK(scratch.numel() >= need, "muon_update: scratch has ", scratch.numel(), " elements, needs ", need,
             " for ", param.shape().str());

  float* g = grad.data<float>();
  float* mp = m.data<float>();
  const float beta = hp.momentum;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // Flushed as AdamW's moments: an expert no token reaches has g = 0 and its momentum decays.
    float mi = ops::flush_subnormal(beta * mp[i] + g[i]);
    mp[i] = mi;
    g[i] = g[i] + beta * mi;  // Nesterov: look one momentum step ahead
  }

  // Every matrix of a stack is orthogonalized on its own (one batched Newton–Schulz).
  Tensor O = scratch.window(0, param.shape());
  Tensor ws = scratch.window(n, Shape{need - n});
  ops::newton_schulz_orthogonalize(grad, O, ws, hp.ns_steps, hp.ns_dtype);

  // Decoupled weight decay and the scaled update in one pass; both read the pre-step p.
  const float lr = hp.lr, wd = hp.weight_decay, s = muon_scale(rows, cols);
  float* p = param.data<float>();
  const float* o = O.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] -= lr * (wd * p[i] + s * o[i]);
}

void muon_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
                 const MuonHyper& hp) {
  ZAYA_CHECK(param.ndim() == 2, "muon_update: param must be 2-D, found ", param.str());
  muon_update_stack(param, grad, m, scratch, hp);
}

}  // namespace zaya::optim
