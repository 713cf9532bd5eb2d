// The gradient-wire ops' fronts: argument checks for any device, then the kernel for the tensors'
// device (CPU: cpu/grad_wire_cpu.cc; CUDA: cuda/grad_wire.cu).
#include "zaya/ops/grad_wire.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/grad_wire_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/grad_wire_cuda.h"
#endif

namespace zaya::ops {

void accumulate_wide(const Tensor& wide, const Tensor& g) {
  constexpr std::string_view op = "accumulate_wide";
  const OpDevice on(op, {{"wide", wide}, {"g", g}});
  check::dtype(op, "wide", wide, DType::f64);
  check::f32(op, "g", g);
  check::same_shape(op, "wide", wide, "g", g);
  if (on.cpu()) return cpu::accumulate_wide(wide, g);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::accumulate_wide(wide, g);
#endif
  on.no_kernel();
}

void narrow_scaled(const Tensor& g, const Tensor& wide, double scale) {
  constexpr std::string_view op = "narrow_scaled";
  const OpDevice on(op, {{"g", g}, {"wide", wide}});
  check::f32(op, "g", g);
  check::dtype(op, "wide", wide, DType::f64);
  check::same_shape(op, "g", g, "wide", wide);
  if (on.cpu()) return cpu::narrow_scaled(g, wide, scale);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::narrow_scaled(g, wide, scale);
#endif
  on.no_kernel();
}

void to_bf16_wire(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "to_bf16_wire";
  const OpDevice on(op, {{"dst", dst}, {"src", src}});
  check::dtype(op, "dst", dst, DType::bf16);
  check::f32(op, "src", src);
  check::same_shape(op, "dst", dst, "src", src);
  if (on.cpu()) return cpu::to_bf16_wire(dst, src);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::to_bf16_wire(dst, src);
#endif
  on.no_kernel();
}

void from_bf16_wire(const Tensor& dst, const Tensor& src, float scale) {
  constexpr std::string_view op = "from_bf16_wire";
  const OpDevice on(op, {{"dst", dst}, {"src", src}});
  check::f32(op, "dst", dst);
  check::dtype(op, "src", src, DType::bf16);
  check::same_shape(op, "dst", dst, "src", src);
  if (on.cpu()) return cpu::from_bf16_wire(dst, src, scale);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::from_bf16_wire(dst, src, scale);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
