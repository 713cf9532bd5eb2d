// Argument checks and dispatch for the bias-then-scale op (kernels in cpu/scale_bias_cpu.cc and
// cuda/scale_bias.cu).
#include "zaya/ops/scale_bias.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/scale_bias_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/scale_bias_eda_cuda.h"
#endif

namespace zaya::ops {
namespace {
// x [N, F]; returns (N, F).
std::pair<int64_t, int64_t> rows_cols(std::string_view op, const Tensor& x) {
  check::f32(op, "x", x);
  ZAYA_CHECK(x.ndim() == 2, op, ": x must be [N, F], found ", x.str());
  return {x.size(0), x.size(1)};
}
}  // namespace

void scale_bias_forward(const Tensor& y, const Tensor& x, const Tensor& b, const Tensor& g) {
  constexpr std::string_view op = "scale_bias_forward";
  const OpDevice on(op, {{"x", x}, {"b", b}, {"g", g}, {"y", y}});
  const auto [N, F] = rows_cols(op, x);
  check::exact(op, "b", b, Shape{F});
  check::exact(op, "g", g, Shape{F});
  check::exact(op, "y", y, Shape{N, F});
  if (on.cpu()) return cpu::scale_bias_forward(x.data<float>(), b.data<float>(), g.data<float>(), y.data<float>(), N, F);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::scale_bias_forward(y, x, b, g);
#endif
  on.no_kernel();
}

void scale_bias_backward(const Tensor& dx, const Tensor& db, const Tensor& dg, const Tensor& dy, const Tensor& x,
                         const Tensor& b, const Tensor& g) {
  constexpr std::string_view op = "scale_bias_backward";
  const OpDevice on(op, {{"dy", dy}, {"x", x}, {"b", b}, {"g", g}, {"dx", dx}, {"db", db}, {"dg", dg}});
  const auto [N, F] = rows_cols(op, x);
  check::exact(op, "dy", dy, Shape{N, F});
  check::exact(op, "b", b, Shape{F});
  check::exact(op, "g", g, Shape{F});
  check::exact(op, "dx", dx, Shape{N, F});
  check::exact(op, "db", db, Shape{F});
  check::exact(op, "dg", dg, Shape{F});
  if (on.cpu())
    return cpu::scale_bias_backward(dy.data<float>(), x.data<float>(), b.data<float>(), g.data<float>(),
                                    dx.data<float>(), db.data<float>(), dg.data<float>(), N, F);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::scale_bias_backward(dx, db, dg, dy, x, b, g);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
