#include "zaya/optim/balancer.h"

#include <cmath>
#include <vector>

#include "zaya/ops/optim_ops.h"

namespace zaya::optim {

BalanceController::BalanceController(int64_t layers, int64_t experts, double lr, double beta1, double beta2,
                                     double eps, Device device)
    : L_(layers), E_(experts), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps) {
  ZAYA_CHECK(layers >= 1 && experts >= 1, "BalanceController: need >= 1 layer and expert, found ", layers,
             ", ", experts);
  m_ = Tensor::zeros(Shape{L_, E_}, DType::f32, device);
  v_ = Tensor::zeros(Shape{L_, E_}, DType::f32, device);
  g_ = Tensor::zeros(Shape{L_, E_}, DType::f32, device);
  g_host_ = device == Device::cpu ? g_ : Tensor::zeros(Shape{L_, E_}, DType::f32);
}

void BalanceController::step(const Tensor& biases, std::span<const int64_t> counts, double lr_scale) {
  ZAYA_CHECK(m_.defined(), "BalanceController: not constructed for a model");
  check_shape("BalanceController: balancing biases", biases, Shape{L_, E_ + 1});
  check_dtype("BalanceController: balancing biases", biases, DType::f32);
  ZAYA_CHECK(static_cast<int64_t>(counts.size()) == L_ * E_, "BalanceController: expected ", L_ * E_,
             " expert counts (layers x experts), found ", counts.size());
  ++step_;
  ops::AdamWHyper hp;
  ZAYA_CHECK(std::isfinite(lr_scale) && lr_scale >= 0, "BalanceController: lr_scale must be finite and >= 0, found ",
             lr_scale);
  hp.lr = static_cast<float>(lr_ * lr_scale);
  hp.beta1 = static_cast<float>(beta1_);
  hp.beta2 = static_cast<float>(beta2_);
  hp.eps = static_cast<float>(eps_);
  hp.weight_decay = 0.0f;
  // The gradients of every layer on the host, one copy to the biases' device, then each layer's
  // update (a layer without routed tokens is left alone).
  std::vector<bool> active(static_cast<size_t>(L_), false);
  for (int64_t l = 0; l < L_; ++l) {
    int64_t total = 0;
    for (int64_t e = 0; e < E_; ++e) {
      ZAYA_CHECK(counts[l * E_ + e] >= 0, "BalanceController: negative count ", counts[l * E_ + e],
                 " at layer ", l, " expert ", e);
      total += counts[l * E_ + e];
    }
    if (total == 0) continue;
    active[static_cast<size_t>(l)] = true;
    float* g = g_host_.data<float>() + l * E_;
    for (int64_t e = 0; e < E_; ++e)
      g[e] = static_cast<float>(static_cast<double>(counts[l * E_ + e]) / static_cast<double>(total) -
                                1.0 / static_cast<double>(E_));
  }
  if (!g_.shares_storage_with(g_host_)) g_.copy_from(g_host_);
  for (int64_t l = 0; l < L_; ++l) {
    if (!active[static_cast<size_t>(l)]) continue;
    // Real experts are the first E entries of the layer's [E+1] row; skip (index E) is not pushed.
    Tensor beta = biases.window(l * (E_ + 1), Shape{E_});
    ops::adamw_update(beta, m_.select(l), v_.select(l), g_.select(l), hp, step_);
  }
}

}  // namespace zaya::optim
