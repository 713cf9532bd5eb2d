// The dense ops' fronts: argument checks for any device, then the kernel for the tensors' device
// (CPU: cpu/dense_cpu.cc; CUDA: cuda/dense.cu, and cuda/gemm.cu for linear's cuBLASLt GEMMs).
#include "zaya/ops/dense.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/dense_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/dense_cuda.h"
#include "zaya/ops/cuda/gemm_cuda.h"
#endif

namespace zaya::ops {
namespace {

int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(-1); }
int64_t rows_of(const Tensor& t) {
  int64_t f = last_dim(t);
  return f == 0 ? 0 : t.numel() / f;
}

// Every tensor f32 and shaped like the first; errors name the op and the tensor.
void check_f32_like(std::string_view op,
                    std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  const auto& [first, like] = *tensors.begin();
  for (auto [name, t] : tensors) {
    check::f32(op, name, *t);
    check::same_shape(op, name, *t, first, *like);
  }
}

void check_residual_params(std::string_view op, const ResidualScaleParams& p, int64_t f,
                           std::string_view prefix) {
  check::vector(op, str(prefix, "hidden_states_scale"), p.hidden_scale, f);
  check::vector(op, str(prefix, "hidden_states_bias"), p.hidden_bias, f);
  check::vector(op, str(prefix, "residual_scale"), p.residual_scale, f);
  check::vector(op, str(prefix, "residual_bias"), p.residual_bias, f);
}

}  // namespace

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b) {
  constexpr std::string_view op = "linear_forward";
  const OpDevice on(op, {{"x", x}, {"W", W}, {"b", b}, {"y", y}});
  check::defined(op, "x", x);
  check::defined(op, "W", W);
  check::f32(op, "y", y);
  ZAYA_CHECK(x.ndim() == 2 && W.ndim() == 2, op, ": x ", x.str(), " and W ", W.str(), " must be 2-D");
  ZAYA_CHECK(x.dtype() == W.dtype() && (x.dtype() == DType::f32 || x.dtype() == DType::bf16), op,
             ": x and W must both be f32 or both bf16, found ", x.str(), " and ", W.str());
  ZAYA_CHECK(x.size(1) == W.size(1), op, ": x ", x.shape().str(), " has ", x.size(1), " features, W ",
             W.shape().str(), " expects ", W.size(1));
  const int64_t n = x.size(0), out = W.size(0);
  check::shape(op, "y", y, Shape{n, out});
  if (b.defined()) check::vector(op, "b", b, out);
  if (on.cpu()) return cpu::linear_forward(y, x, W, b);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::linear_forward(y, x, W, b);
#endif
  on.no_kernel();
}

void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx) {
  constexpr std::string_view op = "linear_backward";
  const OpDevice on(
      op, {{"dy", dy}, {"x", x}, {"W", W}, {"dx", dx}, {"dW", dW}, {"db", db}, {"dy_bf16", dy_bf16}});
  check::f32(op, "dy", dy);
  check::defined(op, "x", x);
  check::defined(op, "W", W);
  ZAYA_CHECK(x.ndim() == 2 && W.ndim() == 2, op, ": x ", x.str(), " and W ", W.str(), " must be 2-D");
  ZAYA_CHECK(x.dtype() == W.dtype() && (x.dtype() == DType::f32 || x.dtype() == DType::bf16), op,
             ": x and W must both be f32 or both bf16, found ", x.str(), " and ", W.str());
  const int64_t n = x.size(0), in = x.size(1), out = W.size(0);
  check::shape(op, "W", W, Shape{out, in});
  check::shape(op, "dy", dy, Shape{n, out});
  if (x.dtype() == DType::bf16) {
    ZAYA_CHECK(dy_bf16.defined() && dy_bf16.dtype() == DType::bf16, op,
               ": bf16 x and W need a bf16 dy workspace [", n, ", ", out, "], found ",
               dy_bf16.defined() ? dy_bf16.str() : std::string("none"));
    check::shape(op, "dy_bf16", dy_bf16, Shape{n, out});
  }
  if (dx.defined()) {
    check::f32(op, "dx", dx);
    check::shape(op, "dx", dx, Shape{n, in});
  }
  if (dW.defined()) {
    check::f32(op, "dW", dW);
    check::shape(op, "dW", dW, Shape{out, in});
  }
  if (db.defined()) check::vector(op, "db", db, out);
  if (on.cpu()) return cpu::linear_backward(dx, dW, db, dy, x, W, dy_bf16, accumulate_dx);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::linear_backward(dx, dW, db, dy, x, W, dy_bf16, accumulate_dx);
#endif
  on.no_kernel();
}

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& E) {
  constexpr std::string_view op = "embedding_forward";
  const OpDevice on(op, {{"ids", ids}, {"E", E}, {"y", y}});
  check::i32(op, "ids", ids);
  check::defined(op, "E", E);
  ZAYA_CHECK(E.dtype() == DType::f32 || E.dtype() == DType::bf16, op, ": E must be f32 or bf16, found ",
             E.str());
  check::f32(op, "y", y);
  ZAYA_CHECK(E.ndim() == 2, op, ": E must be [V, H], found ", E.str());
  check::shape(op, "y", y, Shape{ids.numel(), E.size(1)});
  if (on.cpu()) return cpu::embedding_forward(y, ids, E);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::embedding_forward(y, ids, E);
#endif
  on.no_kernel();
}

void embedding_backward(const Tensor& dE, const Tensor& dy, const Tensor& ids, int64_t padding_idx) {
  constexpr std::string_view op = "embedding_backward";
  const OpDevice on(op, {{"dy", dy}, {"ids", ids}, {"dE", dE}});
  check::f32(op, "dy", dy);
  check::i32(op, "ids", ids);
  check::f32(op, "dE", dE);
  ZAYA_CHECK(dE.ndim() == 2, op, ": dE must be [V, H], found ", dE.str());
  check::shape(op, "dy", dy, Shape{ids.numel(), dE.size(1)});
  if (on.cpu()) return cpu::embedding_backward(dE, dy, ids, padding_idx);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::embedding_backward(dE, dy, ids, padding_idx);
#endif
  on.no_kernel();
}

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  const OpDevice on(op, {{"x", x}, {"w", w}, {"y", y}, {"rstd", rstd}});
  check::f32(op, "x", x);
  check::vector(op, "w", w, last_dim(x));
  check::f32(op, "y", y);
  check::same_shape(op, "y", y, "x", x);
  check::f32(op, "rstd", rstd);
  check::shape(op, "rstd", rstd, Shape{rows_of(x)});
  if (on.cpu()) return cpu::rmsnorm_forward(y, rstd, x, w, eps);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::rmsnorm_forward(y, rstd, x, w, eps);
#endif
  on.no_kernel();
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, bool accumulate_dx) {
  constexpr std::string_view op = "rmsnorm_backward";
  const OpDevice on(op, {{"dy", dy}, {"x", x}, {"w", w}, {"rstd", rstd}, {"dx", dx}, {"dw", dw}});
  check::f32(op, "x", x);
  const int64_t f = last_dim(x);
  check::f32(op, "dy", dy);
  check::same_shape(op, "dy", dy, "x", x);
  check::vector(op, "w", w, f);
  check::f32(op, "rstd", rstd);
  check::shape(op, "rstd", rstd, Shape{rows_of(x)});
  if (dx.defined()) {
    check::f32(op, "dx", dx);
    check::same_shape(op, "dx", dx, "x", x);
  }
  if (dw.defined()) check::vector(op, "dw", dw, f);
  if (on.cpu()) return cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd, accumulate_dx);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::rmsnorm_backward(dx, dw, dy, x, w, rstd, accumulate_dx);
#endif
  on.no_kernel();
}

void residual_scale_forward(const Tensor& y, const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  constexpr std::string_view op = "residual_scale_forward";
  const OpDevice on(op, {{"h", h},
                         {"x", x},
                         {"hidden_states_scale", p.hidden_scale},
                         {"hidden_states_bias", p.hidden_bias},
                         {"residual_scale", p.residual_scale},
                         {"residual_bias", p.residual_bias},
                         {"y", y}});
  check_f32_like(op, {{"h", &h}, {"x", &x}, {"y", &y}});
  check_residual_params(op, p, last_dim(h), "");
  if (on.cpu()) return cpu::residual_scale_forward(y, h, x, p);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::residual_scale_forward(y, h, x, p);
#endif
  on.no_kernel();
}

void residual_scale_backward(const Tensor& dh, const Tensor& dx, const ResidualScaleParams& grads, const Tensor& dy,
                             const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  constexpr std::string_view op = "residual_scale_backward";
  const OpDevice on(op, {{"dy", dy},
                         {"h", h},
                         {"x", x},
                         {"hidden_states_scale", p.hidden_scale},
                         {"hidden_states_bias", p.hidden_bias},
                         {"residual_scale", p.residual_scale},
                         {"residual_bias", p.residual_bias},
                         {"dh", dh},
                         {"dx", dx},
                         {"grad of hidden_states_scale", grads.hidden_scale},
                         {"grad of hidden_states_bias", grads.hidden_bias},
                         {"grad of residual_scale", grads.residual_scale},
                         {"grad of residual_bias", grads.residual_bias}});
  // h f32, or its bf16 copy (dense.h); x and dy f32 of h's shape.
  check::defined(op, "h", h);
  ZAYA_CHECK(h.dtype() == DType::f32 || h.dtype() == DType::bf16, op, ": h must be f32 or bf16, found ", h.str());
  check_f32_like(op, {{"x", &x}, {"dy", &dy}});
  check::same_shape(op, "x", x, "h", h);
  const int64_t f = last_dim(h);
  check_residual_params(op, p, f, "");
  check_residual_params(op, grads, f, "grad of ");
  for (auto [name, t] : {std::pair{"dh", &dh}, {"dx", &dx}}) {
    if (!t->defined()) continue;
    check::f32(op, name, *t);
    check::same_shape(op, name, *t, "h", h);
  }
  if (on.cpu()) return cpu::residual_scale_backward(dh, dx, grads, dy, h, x, p);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::residual_scale_backward(dh, dx, grads, dy, h, x, p);
#endif
  on.no_kernel();
}

void silu_forward(const Tensor& y, const Tensor& x) {
  constexpr std::string_view op = "silu_forward";
  const OpDevice on(op, {{"x", x}, {"y", y}});
  check_f32_like(op, {{"x", &x}, {"y", &y}});
  if (on.cpu()) return cpu::silu_forward(y, x);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::silu_forward(y, x);
#endif
  on.no_kernel();
}

void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  constexpr std::string_view op = "silu_backward";
  const OpDevice on(op, {{"dy", dy}, {"x", x}, {"dx", dx}});
  check_f32_like(op, {{"x", &x}, {"dy", &dy}, {"dx", &dx}});
  if (on.cpu()) return cpu::silu_backward(dx, dy, x);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::silu_backward(dx, dy, x);
#endif
  on.no_kernel();
}

void gelu_forward(const Tensor& y, const Tensor& x) {
  constexpr std::string_view op = "gelu_forward";
  const OpDevice on(op, {{"x", x}, {"y", y}});
  check_f32_like(op, {{"x", &x}, {"y", &y}});
  if (on.cpu()) return cpu::gelu_forward(y, x);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::gelu_forward(y, x);
#endif
  on.no_kernel();
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  constexpr std::string_view op = "gelu_backward";
  const OpDevice on(op, {{"dy", dy}, {"x", x}, {"dx", dx}});
  check_f32_like(op, {{"x", &x}, {"dy", &dy}, {"dx", &dx}});
  if (on.cpu()) return cpu::gelu_backward(dx, dy, x);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::gelu_backward(dx, dy, x);
#endif
  on.no_kernel();
}

void swiglu_forward(const Tensor& y, const Tensor& gu) {
  constexpr std::string_view op = "swiglu_forward";
  const OpDevice on(op, {{"gu", gu}, {"y", y}});
  check::f32(op, "gu", gu);
  check::f32(op, "y", y);
  ZAYA_CHECK(gu.ndim() == 2 && gu.size(1) % 2 == 0, op, ": gu must be [N, 2I], found ", gu.str());
  check::shape(op, "y", y, Shape{gu.size(0), gu.size(1) / 2});
  if (on.cpu()) return cpu::swiglu_forward(y, gu);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::swiglu_forward(y, gu);
#endif
  on.no_kernel();
}

void swiglu_backward(const Tensor& dgu, const Tensor& dy, const Tensor& gu) {
  constexpr std::string_view op = "swiglu_backward";
  const OpDevice on(op, {{"dy", dy}, {"gu", gu}, {"dgu", dgu}});
  ZAYA_CHECK(gu.dtype() == DType::f32 || gu.dtype() == DType::bf16, op, ": gu must be f32 or bf16, found ", gu.str());
  check::f32(op, "dy", dy);
  check::f32(op, "dgu", dgu);
  ZAYA_CHECK(gu.ndim() == 2 && gu.size(1) % 2 == 0, op, ": gu must be [N, 2I], found ", gu.str());
  check::shape(op, "dy", dy, Shape{gu.size(0), gu.size(1) / 2});
  check::same_shape(op, "dgu", dgu, "gu", gu);
  if (on.cpu()) return cpu::swiglu_backward(dgu, dy, gu);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::swiglu_backward(dgu, dy, gu);
#endif
  on.no_kernel();
}

void cast_to_bf16(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "cast_to_bf16";
  const OpDevice on(op, {{"src", src}, {"dst", dst}});
  check::f32(op, "src", src);
  check::dtype(op, "dst", dst, DType::bf16);
  ZAYA_CHECK(dst.numel() == src.numel(), op, ": dst ", dst.str(), " must have as many elements as src ",
             src.str());
  if (on.cpu()) return cpu::cast_to_bf16(dst, src);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cast_to_bf16(dst, src);
#endif
  on.no_kernel();
}

void cast_to_f32(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "cast_to_f32";
  const OpDevice on(op, {{"src", src}, {"dst", dst}});
  check::dtype(op, "src", src, DType::bf16);
  check::f32(op, "dst", dst);
  ZAYA_CHECK(dst.numel() == src.numel(), op, ": dst ", dst.str(), " must have as many elements as src ",
             src.str());
  if (on.cpu()) return cpu::cast_to_f32(dst, src);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cast_to_f32(dst, src);
#endif
  on.no_kernel();
}

void softmax_forward(const Tensor& y, const Tensor& x) {
  constexpr std::string_view op = "softmax_forward";
  const OpDevice on(op, {{"x", x}, {"y", y}});
  check_f32_like(op, {{"x", &x}, {"y", &y}});
  if (on.cpu()) return cpu::softmax_forward(y, x, cpu::StoreMode::automatic);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::softmax_forward(y, x);
#endif
  on.no_kernel();
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  constexpr std::string_view op = "softmax_backward";
  const OpDevice on(op, {{"dy", dy}, {"y", y}, {"dx", dx}});
  check_f32_like(op, {{"y", &y}, {"dy", &dy}, {"dx", &dx}});
  if (on.cpu()) return cpu::softmax_backward(dx, dy, y);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::softmax_backward(dx, dy, y);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
