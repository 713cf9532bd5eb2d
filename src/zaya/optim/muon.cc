#include "zaya/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "zaya/ops/cpu/newton_schulz_cpu.h"
#include "zaya/ops/cpu/optim_ops_cpu.h"
#include "zaya/ops/newton_schulz.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::optim {

float muon_scale(int64_t rows, int64_t cols) {
  return static_cast<float>(0.2 * std::sqrt(static_cast<double>(std::max(rows, cols))));
}

int64_t muon_scratch_elems(int64_t rows, int64_t cols, int64_t count, DType ns_dtype) {
  return count * rows * cols + ops::newton_schulz_workspace_elems(rows, cols, count, ns_dtype);
}

namespace {

// Checks the arguments; returns the f32 elements of scratch the update uses.
int64_t check_muon_args(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
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
  const int64_t need = muon_scratch_elems(param.size(-2), param.size(-1), count, hp.ns_dtype);
  ZAYA_CHECK(scratch.numel() >= need, "muon_update: scratch has ", scratch.numel(), " elements, needs ", need,
             " for ", param.shape().str());
  return need;
}

// Momentum, Newton–Schulz on every matrix of the parameter, update: on all threads, or with all
// of its work on the calling thread (`alone`).
void update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
            const MuonHyper& hp, bool alone) {
  const int64_t need = check_muon_args(param, grad, m, scratch, hp);
  const int64_t rows = param.size(-2), cols = param.size(-1), n = param.numel();
  if (alone)
    ops::cpu::muon_momentum(grad, m, hp.momentum, /*on_this_thread=*/true);
  else
    ops::muon_momentum(grad, m, hp.momentum);
  // Every matrix of a stack is orthogonalized on its own (one batched Newton–Schulz).
  Tensor O = scratch.window(0, param.shape()), ws = scratch.window(n, Shape{need - n});
  if (alone)
    ops::cpu::newton_schulz_orthogonalize_on_this_thread(O, grad, ws, hp.ns_steps, hp.ns_dtype);
  else
    ops::newton_schulz_orthogonalize(O, grad, ws, hp.ns_steps, hp.ns_dtype);
  if (alone)
    ops::cpu::muon_apply(param, O, hp.lr, hp.weight_decay, muon_scale(rows, cols), /*on_this_thread=*/true);
  else
    ops::muon_apply(param, O, hp.lr, hp.weight_decay, muon_scale(rows, cols));
}

}  // namespace

void muon_update_stack(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
                       const MuonHyper& hp) {
  update(param, grad, m, scratch, hp, false);
}

void muon_update_on_this_thread(const Tensor& param, const Tensor& grad, const Tensor& m,
                                const Tensor& scratch, const MuonHyper& hp) {
  ZAYA_CHECK(param.ndim() == 2, "muon_update_on_this_thread: param must be 2-D, found ", param.str());
  update(param, grad, m, scratch, hp, true);
}

void muon_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
                 const MuonHyper& hp) {
  ZAYA_CHECK(param.ndim() == 2, "muon_update: param must be 2-D, found ", param.str());
  muon_update_stack(param, grad, m, scratch, hp);
}

}  // namespace zaya::optim
