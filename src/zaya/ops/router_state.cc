// Argument checks and dispatch for the router state (kernels in cpu/router_state_cpu.cc and
// cuda/router_state.cu).
#include "zaya/ops/router_state.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/router_state_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/scale_bias_eda_cuda.h"
#endif

namespace zaya::ops {

void eda_forward(const Tensor& r, const Tensor& r_prev, const Tensor& s) {
  constexpr std::string_view op = "eda_forward";
  const OpDevice on(op, {{"r", r}, {"r_prev", r_prev}, {"s", s}});
  check::f32(op, "r", r);
  ZAYA_CHECK(r.ndim() == 2, op, ": r must be [N, R], found ", r.str());
  const int64_t N = r.size(0), R = r.size(1);
  check::exact(op, "r_prev", r_prev, Shape{N, R});
  check::exact(op, "s", s, Shape{R});
  if (on.cpu()) return cpu::eda_forward(r.data<float>(), r_prev.data<float>(), s.data<float>(), N, R);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::eda_forward(r, r_prev, s);
#endif
  on.no_kernel();
}

void eda_backward(const Tensor& dr, const Tensor& carried, const Tensor& ds, const Tensor& r_prev,
                  const Tensor& s) {
  constexpr std::string_view op = "eda_backward";
  const OpDevice on(op, {{"dr", dr}, {"carried", carried}, {"r_prev", r_prev}, {"s", s}, {"ds", ds}});
  check::f32(op, "dr", dr);
  ZAYA_CHECK(dr.ndim() == 2, op, ": dr must be [N, R], found ", dr.str());
  const int64_t N = dr.size(0), R = dr.size(1);
  check::exact(op, "carried", carried, Shape{N, R});
  const bool eda = r_prev.defined();
  ZAYA_CHECK(s.defined() == eda && ds.defined() == eda, op,
             ": r_prev, s and ds must all be defined (a layer with EDA) or all undefined (layer 0)");
  if (eda) {
    check::exact(op, "r_prev", r_prev, Shape{N, R});
    check::exact(op, "s", s, Shape{R});
    check::exact(op, "ds", ds, Shape{R});
  }
  if (on.cpu())
    return cpu::eda_backward(dr.data<float>(), carried.data<float>(), eda ? r_prev.data<float>() : nullptr,
                             eda ? s.data<float>() : nullptr, eda ? ds.data<float>() : nullptr, N, R);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::eda_backward(dr, carried, ds, r_prev, s);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
