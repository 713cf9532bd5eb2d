// The optimizer primitives' fronts: argument checks for any device, then the kernel for the
// tensors' device (CPU: cpu/optim_ops_cpu.cc; CUDA: cuda/optim_ops.cu).
#include "zaya/ops/optim_ops.h"

#include <utility>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/optim_ops_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/optim_cuda.h"
#endif

namespace zaya::ops {

double global_grad_norm(std::span<const Tensor> grads) {
  constexpr std::string_view op = "global_grad_norm";
  for (size_t i = 0; i < grads.size(); ++i) check::f32(op, str("gradient ", i), grads[i]);
  const OpDevice on(op, "gradient", grads);
  if (on.cpu()) return cpu::global_grad_norm(grads);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::global_grad_norm(grads);
#endif
  on.no_kernel();
}

void scale_inplace(const Tensor& t, float s) {
  constexpr std::string_view op = "scale_inplace";
  const OpDevice on(op, {{"t", t}});
  check::f32(op, "t", t);
  if (on.cpu()) return cpu::scale_inplace(t, s);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::scale_inplace(t, s);
#endif
  on.no_kernel();
}

// Device-neutral: the norm comes back to the host (the clipping decision needs it) and the scaling
// is one op per tensor.
double clip_grad_norm(std::span<const Tensor> grads, double max_norm) {
  ZAYA_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, found ", max_norm);
  double norm = global_grad_norm(grads);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const Tensor& g : grads) scale_inplace(g, static_cast<float>(coef));
  return norm;
}

void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad,
                  const AdamWHyper& hp, int64_t step) {
  constexpr std::string_view op = "adamw_update";
  const OpDevice on(op, {{"param", param}, {"grad", grad}, {"m", m}, {"v", v}});
  check::f32(op, "param", param);
  for (auto [name, t] : {std::pair{"grad", &grad}, {"m", &m}, {"v", &v}}) {
    check::f32(op, name, *t);
    check::same_shape(op, name, *t, "param", param);
  }
  ZAYA_CHECK(step >= 1, op, ": step must be >= 1 (bias correction divides by 1 - beta^step), found ", step);
  if (on.cpu()) return cpu::adamw_update(param, m, v, grad, hp, step);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::adamw_update(param, m, v, grad, hp, step);
#endif
  on.no_kernel();
}

void muon_momentum(const Tensor& grad, const Tensor& m, float beta) {
  constexpr std::string_view op = "muon_momentum";
  const OpDevice on(op, {{"grad", grad}, {"m", m}});
  check::f32(op, "grad", grad);
  check::f32(op, "m", m);
  check::same_shape(op, "m", m, "grad", grad);
  if (on.cpu()) return cpu::muon_momentum(grad, m, beta);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::muon_momentum(grad, m, beta);
#endif
  on.no_kernel();
}

void muon_apply(const Tensor& param, const Tensor& update, float lr, float weight_decay, float scale) {
  constexpr std::string_view op = "muon_apply";
  const OpDevice on(op, {{"param", param}, {"update", update}});
  check::f32(op, "param", param);
  check::f32(op, "update", update);
  check::same_shape(op, "update", update, "param", param);
  if (on.cpu()) return cpu::muon_apply(param, update, lr, weight_decay, scale);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::muon_apply(param, update, lr, weight_decay, scale);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
