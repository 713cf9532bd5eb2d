// Argument checks and dispatch for the bias-then-scale op (kernels in cpu/scale_bias_cpu.cc).
#include "zaya/ops/scale_bias.h"

#include "zaya/ops/cpu/op_checks.h"
#include "zaya/ops/cpu/scale_bias_cpu.h"

namespace zaya::ops {
namespace {
// x [N, F]; returns (N, F).
std::pair<int64_t, int64_t> rows_cols(std::string_view op, const Tensor& x) {
  seq::require_cpu_f32(op, "x", x);
  ZAYA_CHECK(x.ndim() == 2, op, ": x must be [N, F], found ", x.str());
  return {x.size(0), x.size(1)};
}
}  // namespace

void scale_bias_forward(const Tensor& x, const Tensor& b, const Tensor& g, const Tensor& y) {
  constexpr std::string_view op = "ops::scale_bias_forward";
  const auto [N, F] = rows_cols(op, x);
  seq::require_exact(op, "b", b, Shape{F});
  seq::require_exact(op, "g", g, Shape{F});
  seq::require_exact(op, "y", y, Shape{N, F});
  cpu::scale_bias_forward(x.data<float>(), b.data<float>(), g.data<float>(), y.data<float>(), N, F);
}

void scale_bias_backward(const Tensor& dy, const Tensor& x, const Tensor& b, const Tensor& g, const Tensor& dx,
                         const Tensor& db, const Tensor& dg) {
  constexpr std::string_view op = "ops::scale_bias_backward";
  const auto [N, F] = rows_cols(op, x);
  seq::require_exact(op, "dy", dy, Shape{N, F});
  seq::require_exact(op, "b", b, Shape{F});
  seq::require_exact(op, "g", g, Shape{F});
  seq::require_exact(op, "dx", dx, Shape{N, F});
  seq::require_exact(op, "db", db, Shape{F});
  seq::require_exact(op, "dg", dg, Shape{F});
  cpu::scale_bias_backward(dy.data<float>(), x.data<float>(), b.data<float>(), g.data<float>(), dx.data<float>(),
                           db.data<float>(), dg.data<float>(), N, F);
}

}  // namespace zaya::ops
