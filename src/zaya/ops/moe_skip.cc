// Argument checks and dispatch for the skip-class passthrough (kernels in cpu/moe_skip_cpu.cc and
// cuda/moe_skip.cu).
#include "zaya/ops/moe_skip.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/moe_skip_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/moe_skip_cuda.h"
#endif

namespace zaya::ops {

namespace {
// What every skip op checks: the dimensions, the router's probabilities [N, E+1] and the choices.
void check_common(std::string_view op, const Tensor& probs, const Tensor& choice, int64_t N, int64_t E,
                  int64_t H) {
  check::positive(op, "N", N);
  check::positive(op, "E", E);
  check::positive(op, "H", H);
  check::exact(op, "probs", probs, Shape{N, E + 1});
  check::i32(op, "choice", choice);
  check::shape(op, "choice", choice, Shape{N});
}
}  // namespace

void moe_skip_forward(const Tensor& out, const Tensor& x, const Tensor& probs, const Tensor& choice, int64_t N,
                      int64_t E, int64_t H) {
  constexpr std::string_view op = "moe_skip_forward";
  const OpDevice on(op, {{"out", out}, {"x", x}, {"probs", probs}, {"choice", choice}});
  check_common(op, probs, choice, N, E, H);
  check::n_rows(op, "out", out, N, H);
  check::n_rows(op, "x", x, N, H);
  if (on.cpu())
    return cpu::moe_skip_forward(out.data<float>(), x.data<float>(), probs.data<float>(), choice.data<int32_t>(),
                                 N, E, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_skip_forward(out, x, probs, choice, N, E, H);
#endif
  on.no_kernel();
}

void moe_skip_input_backward(const Tensor& dx, const Tensor& dout, const Tensor& probs, const Tensor& choice,
                             int64_t N, int64_t E, int64_t H) {
  constexpr std::string_view op = "moe_skip_input_backward";
  const OpDevice on(op, {{"dx", dx}, {"dout", dout}, {"probs", probs}, {"choice", choice}});
  check_common(op, probs, choice, N, E, H);
  check::n_rows(op, "dx", dx, N, H);
  check::n_rows(op, "dout", dout, N, H);
  if (on.cpu())
    return cpu::moe_skip_input_backward(dx.data<float>(), dout.data<float>(), probs.data<float>(),
                                        choice.data<int32_t>(), N, E, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_skip_input_backward(dx, dout, probs, choice, N, E, H);
#endif
  on.no_kernel();
}

void moe_skip_router_backward(const Tensor& dlogits, const Tensor& dout, const Tensor& x, const Tensor& probs,
                              const Tensor& choice, int64_t N, int64_t E, int64_t H) {
  constexpr std::string_view op = "moe_skip_router_backward";
  const OpDevice on(op, {{"dlogits", dlogits}, {"dout", dout}, {"x", x}, {"probs", probs}, {"choice", choice}});
  check_common(op, probs, choice, N, E, H);
  check::exact(op, "dlogits", dlogits, Shape{N, E + 1});
  check::n_rows(op, "dout", dout, N, H);
  check::n_rows(op, "x", x, N, H);
  if (on.cpu())
    return cpu::moe_skip_router_backward(dlogits.data<float>(), dout.data<float>(), x.data<float>(),
                                         probs.data<float>(), choice.data<int32_t>(), N, E, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_skip_router_backward(dlogits, dout, x, probs, choice, N, E, H);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
