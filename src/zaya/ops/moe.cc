// Argument checks and dispatch for MoE routing and permutation (kernels in cpu/moe_cpu.cc and
// cuda/moe.cu).
#include "zaya/ops/moe.h"

#include <initializer_list>
#include <tuple>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/moe_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/moe_cuda.h"
#endif

namespace zaya::ops {

namespace {
void check_nh(std::string_view op, int64_t M, int64_t N, int64_t H) {
  check::positive(op, "N", N);
  check::positive(op, "H", H);
  ZAYA_CHECK(M >= 0 && M <= N, op, ": routed rows M must be in [0, N = ", N, "], found ", M);
}
// A permuted activation: at least M rows of H (the caller sizes it for the worst case N).
void check_permuted(std::string_view op, std::string_view what, const Tensor& t, int64_t M, int64_t H) {
  check::f32(op, what, t);
  ZAYA_CHECK(t.ndim() == 2 && t.size(1) == H && t.size(0) >= M, op, ": ", what, " has shape ",
             t.shape().str(), ", expected [>=", M, ", ", H, "]");
}
}  // namespace

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits, const Tensor& beta,
               int64_t N, int64_t E) {
  constexpr std::string_view op = "moe_route";
  const OpDevice on(op, {{"probs", probs},
                         {"choice", choice},
                         {"weight", weight},
                         {"router logits", logits},
                         {"balancing_biases", beta}});
  check::positive(op, "N", N);
  check::positive(op, "E", E);
  check::exact(op, "router logits", logits, Shape{N, E + 1});
  check::exact(op, "balancing_biases", beta, Shape{E + 1});
  check::exact(op, "probs", probs, Shape{N, E + 1});
  check::exact(op, "weight", weight, Shape{N});
  check::i32(op, "choice", choice);
  check::shape(op, "choice", choice, Shape{N});
  if (on.cpu())
    return cpu::moe_route(probs.data<float>(), choice.data<int32_t>(), weight.data<float>(),
                          logits.data<float>(), beta.data<float>(), N, E);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_route(probs, choice, weight, logits, beta, N, E);
#endif
  on.no_kernel();
}

void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        int64_t N, int64_t E) {
  constexpr std::string_view op = "moe_route_backward";
  const OpDevice on(op, {{"dlogits", dlogits}, {"dweight", dweight}, {"probs", probs}, {"choice", choice}});
  check::positive(op, "N", N);
  check::positive(op, "E", E);
  check::exact(op, "dlogits", dlogits, Shape{N, E + 1});
  check::exact(op, "probs", probs, Shape{N, E + 1});
  check::exact(op, "dweight", dweight, Shape{N});
  check::i32(op, "choice", choice);
  check::shape(op, "choice", choice, Shape{N});
  if (on.cpu())
    return cpu::moe_route_bwd(dlogits.data<float>(), dweight.data<float>(), probs.data<float>(),
                              choice.data<int32_t>(), N, E);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_route_backward(dlogits, dweight, probs, choice, N, E);
#endif
  on.no_kernel();
}

int64_t moe_plan(const Tensor& counts, const Tensor& offsets, const Tensor& pos, const Tensor& src, const Tensor& choice, int64_t N,
                 int64_t E) {
  constexpr std::string_view op = "moe_plan";
  const OpDevice on(
      op, {{"counts", counts}, {"offsets", offsets}, {"pos", pos}, {"src", src}, {"choice", choice}});
  check::positive(op, "N", N);
  check::positive(op, "E", E);
  for (auto [name, t, n] : {std::tuple<const char*, const Tensor*, int64_t>{"counts", &counts, E},
                            {"offsets", &offsets, E + 1},
                            {"pos", &pos, N},
                            {"src", &src, N},
                            {"choice", &choice, N}}) {
    check::i32(op, name, *t);
    check::shape(op, name, *t, Shape{n});
  }
#if defined(ZAYA_HAVE_CUDA)
  // The CUDA plan checks the choices on the device and reports the first bad one with M.
  if (on.cuda()) return cuda::moe_plan(counts, offsets, pos, src, choice, N, E);
#endif
  if (!on.cpu()) on.no_kernel();
  // The choices are read on the host: a range check for the CPU kernel, which indexes by them.
  const int32_t* c = choice.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    ZAYA_CHECK(c[n] >= 0 && c[n] <= E, op, ": choice[", n, "] = ", c[n], ", expected an expert in [0, ", E,
               "]");
  return cpu::moe_plan(counts.data<int32_t>(), offsets.data<int32_t>(), pos.data<int32_t>(),
                       src.data<int32_t>(), c, N, E);
}

namespace {
// xp[r] = x[src[r]] for r0 <= r < r1, after the checks both gathers share.
void gather_checked(std::string_view op, const Tensor& xp, const Tensor& x, const Tensor& src, int64_t r0,
                    int64_t r1, int64_t N, int64_t H) {
  const OpDevice on(op, {{"xp", xp}, {"x", x}, {"src", src}});
  check_nh(op, r1, N, H);
  check::n_rows(op, "x", x, N, H);
  check_permuted(op, "xp", xp, r1, H);
  check::i32(op, "src", src);
  check::shape(op, "src", src, Shape{N});
  if (on.cpu())
    return cpu::moe_gather(xp.data<float>() + r0 * H, x.data<float>(), src.data<int32_t>() + r0, r1 - r0, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_gather(xp, x, src, r0, r1, H, op);
#endif
  on.no_kernel();
}
}  // namespace

void moe_gather(const Tensor& xp, const Tensor& x, const Tensor& src, int64_t M, int64_t N, int64_t H) {
  gather_checked("moe_gather", xp, x, src, 0, M, N, H);
}

void moe_gather_rows(const Tensor& xp, const Tensor& x, const Tensor& src, int64_t r0, int64_t r1, int64_t N,
                     int64_t H) {
  constexpr std::string_view op = "moe_gather_rows";
  ZAYA_CHECK(0 <= r0 && r0 <= r1 && r1 <= N, op, ": rows [", r0, ", ", r1, ") out of range for N = ", N);
  gather_checked(op, xp, x, src, r0, r1, N, H);
}

void moe_gather_backward(const Tensor& dx, const Tensor& dxp, const Tensor& pos, int64_t M, int64_t N, int64_t H) {
  constexpr std::string_view op = "moe_gather_backward";
  const OpDevice on(op, {{"dx", dx}, {"dxp", dxp}, {"pos", pos}});
  check_nh(op, M, N, H);
  check::n_rows(op, "dx", dx, N, H);
  check_permuted(op, "dxp", dxp, M, H);
  check::i32(op, "pos", pos);
  check::shape(op, "pos", pos, Shape{N});
  if (on.cpu()) return cpu::moe_gather_bwd(dx.data<float>(), dxp.data<float>(), pos.data<int32_t>(), N, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_gather_backward(dx, dxp, pos, N, H);
#endif
  on.no_kernel();
}

void moe_unpermute(const Tensor& out, const Tensor& y, const Tensor& weight, const Tensor& pos, int64_t M,
                   int64_t N, int64_t H) {
  constexpr std::string_view op = "moe_unpermute";
  const OpDevice on(op, {{"out", out}, {"y", y}, {"weight", weight}, {"pos", pos}});
  check_nh(op, M, N, H);
  check::n_rows(op, "out", out, N, H);
  check_permuted(op, "y", y, M, H);
  check::exact(op, "weight", weight, Shape{N});
  check::i32(op, "pos", pos);
  check::shape(op, "pos", pos, Shape{N});
  if (on.cpu())
    return cpu::moe_unpermute(out.data<float>(), y.data<float>(), weight.data<float>(), pos.data<int32_t>(),
                              N, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_unpermute(out, y, weight, pos, N, H);
#endif
  on.no_kernel();
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& dweight, const Tensor& dout, const Tensor& y,
                            const Tensor& weight, const Tensor& pos, int64_t M, int64_t N, int64_t H) {
  constexpr std::string_view op = "moe_unpermute_backward";
  const OpDevice on(
      op, {{"dy", dy}, {"dweight", dweight}, {"dout", dout}, {"y", y}, {"weight", weight}, {"pos", pos}});
  check_nh(op, M, N, H);
  check::n_rows(op, "dout", dout, N, H);
  ZAYA_CHECK(y.dtype() == DType::f32 || y.dtype() == DType::bf16, op, ": y must be f32 or bf16, found ", y.str());
  ZAYA_CHECK(y.ndim() == 2 && y.size(1) == H && y.size(0) >= M, op, ": y has shape ", y.shape().str(),
             ", expected [>=", M, ", ", H, "]");
  check_permuted(op, "dy", dy, M, H);
  check::exact(op, "weight", weight, Shape{N});
  check::exact(op, "dweight", dweight, Shape{N});
  check::i32(op, "pos", pos);
  check::shape(op, "pos", pos, Shape{N});
  if (on.cpu() && y.dtype() == DType::bf16)
    return cpu::moe_unpermute_bwd(dy.data<float>(), dweight.data<float>(), dout.data<float>(), y.data<bf16>(),
                                  weight.data<float>(), pos.data<int32_t>(), N, H);
  if (on.cpu())
    return cpu::moe_unpermute_bwd(dy.data<float>(), dweight.data<float>(), dout.data<float>(),
                                  y.data<float>(), weight.data<float>(), pos.data<int32_t>(), N, H);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::moe_unpermute_backward(dy, dweight, dout, y, weight, pos, N, H);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
