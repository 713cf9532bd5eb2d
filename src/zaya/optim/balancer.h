// The expert-balance controller (DESIGN.md "Balancing"; Zyphra's "PID" balancer): after each
// optimizer step, for every layer, with p_e = count_e / Σ_e count_e the share of the step's global
// batch routed to real expert e (skip excluded),
//   g_e = p_e − 1/E
// is fed as a gradient to a small AdamW (no weight decay) on that layer's balancing biases β.
// Routing is argmax(p + β), so an over-loaded expert (g_e > 0) gets a lower β_e and fewer tokens.
// The skip class's bias is never touched; β never receives a loss gradient.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zaya/core/tensor.h"

namespace zaya::optim {

class BalanceController {
 public:
  BalanceController() = default;
  // For balancing biases of shape [L, E+1] on `device` (the moments live with the biases).
  BalanceController(int64_t layers, int64_t experts, double lr, double beta1, double beta2, double eps,
                    Device device = Device::cpu);

  // One controller step on `biases` [L, E+1] from counts [L·E] (layer-major, real experts only;
  // summed over micro-batches and all-reduced over data-parallel ranks by the caller). A layer
  // whose tokens all chose skip has no load to balance and is left alone. `lr_scale` multiplies
  // the controller's learning rate for this step (the trainer passes the model's schedule factor
  // when optim.balance_follow_schedule is on).
  void step(const Tensor& biases, std::span<const int64_t> counts, double lr_scale = 1.0);

  int64_t steps() const { return step_; }
  // The AdamW moments [L, E] for checkpoints.
  const Tensor& m() const { return m_; }
  const Tensor& v() const { return v_; }
  void set_steps(int64_t s) { step_ = s; }

 private:
  int64_t L_ = 0, E_ = 0;
  double lr_ = 0, beta1_ = 0.9, beta2_ = 0.95, eps_ = 1e-8;
  int64_t step_ = 0;
  Tensor m_, v_, g_;  // [L, E] f32 on the biases' device; g_ is the gradient scratch
  Tensor g_host_;     // [L, E] f32: the gradient as computed on the host from the counts
};

}  // namespace zaya::optim
