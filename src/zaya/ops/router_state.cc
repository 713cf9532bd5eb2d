// Argument checks and dispatch for the router state (kernels in cpu/router_state_cpu.cc).
#include "zaya/ops/router_state.h"

#include "zaya/ops/cpu/op_checks.h"
#include "zaya/ops/cpu/router_state_cpu.h"

namespace zaya::ops {

void eda_forward(const Tensor& r, const Tensor& r_prev, const Tensor& s) {
  constexpr std::string_view op = "ops::eda_forward";
  seq::require_cpu_f32(op, "r", r);
  ZAYA_CHECK(r.ndim() == 2, op, ": r must be [N, R], found ", r.str());
  const int64_t N = r.size(0), R = r.size(1);
  seq::require_exact(op, "r_prev", r_prev, Shape{N, R});
  seq::require_exact(op, "s", s, Shape{R});
  cpu::eda_forward(r.data<float>(), r_prev.data<float>(), s.data<float>(), N, R);
}

void eda_backward(const Tensor& dr, const Tensor& carried, const Tensor& r_prev, const Tensor& s,
                  const Tensor& ds) {
  constexpr std::string_view op = "ops::eda_backward";
  seq::require_cpu_f32(op, "dr", dr);
  ZAYA_CHECK(dr.ndim() == 2, op, ": dr must be [N, R], found ", dr.str());
  const int64_t N = dr.size(0), R = dr.size(1);
  seq::require_exact(op, "carried", carried, Shape{N, R});
  const bool eda = r_prev.defined();
  ZAYA_CHECK(s.defined() == eda && ds.defined() == eda, op,
             ": r_prev, s and ds must all be defined (a layer with EDA) or all undefined (layer 0)");
  if (eda) {
    seq::require_exact(op, "r_prev", r_prev, Shape{N, R});
    seq::require_exact(op, "s", s, Shape{R});
    seq::require_exact(op, "ds", ds, Shape{R});
  }
  cpu::eda_backward(dr.data<float>(), carried.data<float>(), eda ? r_prev.data<float>() : nullptr,
                    eda ? s.data<float>() : nullptr, eda ? ds.data<float>() : nullptr, N, R);
}

}  // namespace zaya::ops
