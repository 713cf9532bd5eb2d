// Argument checks and dispatch for attention (kernels in cpu/attention_cpu.cc, cpu/attention_at_cpu.cc
// and cuda/attention.cu).
#include "zaya/ops/attention.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/attention_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/sequence_cuda.h"
#endif

namespace zaya::ops {

namespace {
void check_heads(std::string_view op, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  check::positive(op, "nq", nq);
  check::positive(op, "nkv", nkv);
  check::positive(op, "hd", hd);
  ZAYA_CHECK(nq % nkv == 0, op, ": nq (", nq, ") must be a multiple of nkv (", nkv, ")");
}
}  // namespace

namespace {
// The forward's tensors: queries, out and lse over Tq positions, keys and values over Tk.
void check_forward_tensors(std::string_view op, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                           const Tensor& v, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv, int64_t hd) {
  check::rows(op, "q", q, B, Tq, nq * hd);
  check::rows(op, "k", k, B, Tk, nkv * hd);
  check::rows(op, "v", v, B, Tk, nkv * hd);
  check::rows(op, "out", out, B, Tq, nq * hd);
  check::exact(op, "lse", lse, Shape{B, nq, Tq});
}
// The backward's gradients, shaped as what they are gradients of.
void check_gradient_tensors(std::string_view op, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Tensor& dout, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv,
                            int64_t hd) {
  check::rows(op, "dout", dout, B, Tq, nq * hd);
  check::rows(op, "dq", dq, B, Tq, nq * hd);
  check::rows(op, "dk", dk, B, Tk, nkv * hd);
  check::rows(op, "dv", dv, B, Tk, nkv * hd);
}
}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                       int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_forward";
  const OpDevice on(op, {{"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}});
  check_heads(op, B, T, nq, nkv, hd);
  check_forward_tensors(op, out, lse, q, k, v, B, T, T, nq, nkv, hd);
  if (on.cpu())
    return cpu::attention_fwd(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                              v.data<float>(), B, T, nq, nkv, hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_forward(out, lse, q, k, v, B, T, nq, nkv, hd);
#endif
  on.no_kernel();
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                        int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_backward";
  const OpDevice on(op, {{"dq", dq},
                         {"dk", dk},
                         {"dv", dv},
                         {"dout", dout},
                         {"q", q},
                         {"k", k},
                         {"v", v},
                         {"out", out},
                         {"lse", lse}});
  check_heads(op, B, T, nq, nkv, hd);
  check_forward_tensors(op, out, lse, q, k, v, B, T, T, nq, nkv, hd);
  check_gradient_tensors(op, dq, dk, dv, dout, B, T, T, nq, nkv, hd);
  if (on.cpu())
    return cpu::attention_bwd(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                              q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                              lse.data<float>(), B, T, nq, nkv, hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nq, nkv, hd);
#endif
  on.no_kernel();
}

namespace {
void check_at(std::string_view op, int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv,
              int64_t hd) {
  check_heads(op, B, Tq, nq, nkv, hd);
  check::positive(op, "Tk", Tk);
  ZAYA_CHECK(q_pos >= 0 && q_pos + Tq <= Tk, op, ": queries at positions [", q_pos, ", ", q_pos + Tq,
             ") need keys up to their last position, but Tk = ", Tk);
}
}  // namespace

void attention_at_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                          int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_at_forward";
  const OpDevice on(op, {{"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}});
  check_at(op, B, Tq, Tk, q_pos, nq, nkv, hd);
  check_forward_tensors(op, out, lse, q, k, v, B, Tq, Tk, nq, nkv, hd);
  if (on.cpu()) {
    if (q_pos % cpu::attention_tiled_block == 0)  // every query block's diagonal is a key block
      return cpu::attention_tiled_fwd(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                                      v.data<float>(), B, Tq, Tk, q_pos, nq, nkv, hd);
    return cpu::attention_at_fwd(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                                 v.data<float>(), B, Tq, Tk, q_pos, nq, nkv, hd);
  }
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_at_forward(out, lse, q, k, v, B, Tq, Tk, q_pos, nq, nkv, hd);
#endif
  on.no_kernel();
}

void attention_at_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                           const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                           int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd,
                           bool accumulate_dq) {
  constexpr std::string_view op = "attention_at_backward";
  const OpDevice on(op, {{"dq", dq},
                         {"dk", dk},
                         {"dv", dv},
                         {"dout", dout},
                         {"q", q},
                         {"k", k},
                         {"v", v},
                         {"out", out},
                         {"lse", lse}});
  check_at(op, B, Tq, Tk, q_pos, nq, nkv, hd);
  check_forward_tensors(op, out, lse, q, k, v, B, Tq, Tk, nq, nkv, hd);
  check_gradient_tensors(op, dq, dk, dv, dout, B, Tq, Tk, nq, nkv, hd);
  if (on.cpu()) {
    if (q_pos % cpu::attention_tiled_block == 0)
      return cpu::attention_tiled_bwd(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                                      q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                      lse.data<float>(), B, Tq, Tk, q_pos, nq, nkv, hd, /*accumulate_kv=*/true,
                                      /*key_end=*/-1, accumulate_dq);
    return cpu::attention_at_bwd(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                                 q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                 lse.data<float>(), B, Tq, Tk, q_pos, nq, nkv, hd, /*key_end=*/-1, accumulate_dq);
  }
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda())
    return cuda::attention_at_backward(dq, dk, dv, dout, q, k, v, out, lse, B, Tq, Tk, q_pos, nq, nkv, hd,
                                       accumulate_dq);
#endif
  on.no_kernel();
}

void attention_prefix_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_prefix_forward";
  const OpDevice on(op, {{"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}});
  check_heads(op, B, Tq, nq, nkv, hd);
  check::positive(op, "Tk", Tk);
  check_forward_tensors(op, out, lse, q, k, v, B, Tq, Tk, nq, nkv, hd);
  // The queries sit at position Tk, past every key: key_end = Tk bounds them.
  if (on.cpu()) {
    if (Tk % cpu::attention_tiled_block == 0)
      return cpu::attention_tiled_fwd(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                                      v.data<float>(), B, Tq, Tk, /*q_pos=*/Tk, nq, nkv, hd, /*key_end=*/Tk);
    return cpu::attention_at_fwd(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                                 v.data<float>(), B, Tq, Tk, /*q_pos=*/Tk, nq, nkv, hd, /*key_end=*/Tk);
  }
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_prefix_forward(out, lse, q, k, v, B, Tq, Tk, nq, nkv, hd);
#endif
  on.no_kernel();
}

void attention_prefix_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv,
                               int64_t hd) {
  constexpr std::string_view op = "attention_prefix_backward";
  const OpDevice on(op, {{"dq", dq},
                         {"dk", dk},
                         {"dv", dv},
                         {"dout", dout},
                         {"q", q},
                         {"k", k},
                         {"v", v},
                         {"out", out},
                         {"lse", lse}});
  check_heads(op, B, Tq, nq, nkv, hd);
  check::positive(op, "Tk", Tk);
  check_forward_tensors(op, out, lse, q, k, v, B, Tq, Tk, nq, nkv, hd);
  check_gradient_tensors(op, dq, dk, dv, dout, B, Tq, Tk, nq, nkv, hd);
  if (on.cpu()) {
    if (Tk % cpu::attention_tiled_block == 0)
      return cpu::attention_tiled_bwd(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                                      q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                      lse.data<float>(), B, Tq, Tk, /*q_pos=*/Tk, nq, nkv, hd,
                                      /*accumulate_kv=*/true, /*key_end=*/Tk, /*accumulate_q=*/true);
    return cpu::attention_at_bwd(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                                 q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                 lse.data<float>(), B, Tq, Tk, /*q_pos=*/Tk, nq, nkv, hd, /*key_end=*/Tk,
                                 /*accumulate_q=*/true);
  }
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_prefix_backward(dq, dk, dv, dout, q, k, v, out, lse, B, Tq, Tk, nq, nkv, hd);
#endif
  on.no_kernel();
}

void attention_merge(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                     int64_t T, int64_t nq, int64_t hd) {
  constexpr std::string_view op = "attention_merge";
  const OpDevice on(op, {{"out_a", out_a}, {"lse_a", lse_a}, {"out_b", out_b}, {"lse_b", lse_b}});
  check_heads(op, B, T, nq, nq, hd);
  check::rows(op, "out_a", out_a, B, T, nq * hd);
  check::rows(op, "out_b", out_b, B, T, nq * hd);
  check::exact(op, "lse_a", lse_a, Shape{B, nq, T});
  check::exact(op, "lse_b", lse_b, Shape{B, nq, T});
  if (on.cpu())
    return cpu::attention_merge(out_a.data<float>(), lse_a.data<float>(), out_b.data<float>(), lse_b.data<float>(),
                                B, T, nq, hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_merge(out_a, lse_a, out_b, lse_b, B, T, nq, hd);
#endif
  on.no_kernel();
}

void attention_decode(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t B,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_decode";
  const OpDevice on(op, {{"out", out}, {"q", q}, {"k_cache", k_cache}, {"v_cache", v_cache}});
  check_heads(op, B, S, nq, nkv, hd);
  check::n_rows(op, "q", q, B, nq * hd);
  check::n_rows(op, "out", out, B, nq * hd);
  check::f32(op, "k_cache", k_cache);
  const int64_t cap = k_cache.ndim() == 4 ? k_cache.size(1) : -1;
  ZAYA_CHECK(cap >= S, op, ": k_cache has shape ", k_cache.shape().str(), ", expected [", B, ", >=", S, ", ",
             nkv, ", ", hd, "] (S = ", S, " valid positions)");
  check::exact(op, "k_cache", k_cache, Shape{B, cap, nkv, hd});
  check::exact(op, "v_cache", v_cache, Shape{B, cap, nkv, hd});
  if (on.cpu())
    return cpu::attention_decode(out.data<float>(), q.data<float>(), k_cache.data<float>(),
                                 v_cache.data<float>(), B, cap, S, nq, nkv, hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::attention_decode(out, q, k_cache, v_cache, B, S, nq, nkv, hd);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
