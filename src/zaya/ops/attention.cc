// Argument checks and dispatch for attention (kernels in cpu/attention_cpu.cc).
#include "zaya/ops/attention.h"

#include "zaya/ops/cpu/attention_cpu.h"
#include "zaya/ops/cpu/op_checks.h"

namespace zaya::ops {

namespace {
void check_heads(std::string_view op, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  seq::require_positive(op, "B", B);
  seq::require_positive(op, "T", T);
  seq::require_positive(op, "nq", nq);
  seq::require_positive(op, "nkv", nkv);
  seq::require_positive(op, "hd", hd);
  ZAYA_CHECK(nq % nkv == 0, op, ": nq (", nq, ") must be a multiple of nkv (", nkv, ")");
}
}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                       int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_forward";
  check_heads(op, B, T, nq, nkv, hd);
  seq::require_rows(op, "q", q, B, T, nq * hd);
  seq::require_rows(op, "k", k, B, T, nkv * hd);
  seq::require_rows(op, "v", v, B, T, nkv * hd);
  seq::require_rows(op, "out", out, B, T, nq * hd);
  seq::require_exact(op, "lse", lse, Shape{B, nq, T});
  cpu::attention_fwd(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), B,
                     T, nq, nkv, hd);
}

void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t nq,
                        int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_backward";
  check_heads(op, B, T, nq, nkv, hd);
  seq::require_rows(op, "q", q, B, T, nq * hd);
  seq::require_rows(op, "k", k, B, T, nkv * hd);
  seq::require_rows(op, "v", v, B, T, nkv * hd);
  seq::require_rows(op, "out", out, B, T, nq * hd);
  seq::require_rows(op, "dout", dout, B, T, nq * hd);
  seq::require_rows(op, "dq", dq, B, T, nq * hd);
  seq::require_rows(op, "dk", dk, B, T, nkv * hd);
  seq::require_rows(op, "dv", dv, B, T, nkv * hd);
  seq::require_exact(op, "lse", lse, Shape{B, nq, T});
  cpu::attention_bwd(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(), q.data<float>(),
                     k.data<float>(), v.data<float>(), out.data<float>(), lse.data<float>(), B, T, nq, nkv, hd);
}

void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t B,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_decode";
  check_heads(op, B, S, nq, nkv, hd);
  seq::require_n_rows(op, "q", q, B, nq * hd);
  seq::require_n_rows(op, "out", out, B, nq * hd);
  seq::require_cpu_f32(op, "k_cache", k_cache);
  const int64_t cap = k_cache.ndim() == 4 ? k_cache.size(1) : -1;
  ZAYA_CHECK(cap >= S, op, ": k_cache has shape ", k_cache.shape().str(), ", expected [", B, ", >=", S, ", ", nkv,
             ", ", hd, "] (S = ", S, " valid positions)");
  seq::require_exact(op, "k_cache", k_cache, Shape{B, cap, nkv, hd});
  seq::require_exact(op, "v_cache", v_cache, Shape{B, cap, nkv, hd});
  cpu::attention_decode(out.data<float>(), q.data<float>(), k_cache.data<float>(), v_cache.data<float>(), B, cap, S,
                        nq, nkv, hd);
}

}  // namespace zaya::ops
