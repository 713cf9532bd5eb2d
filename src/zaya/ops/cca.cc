// Argument checks and dispatch for the CCA ops (math in cpu/cca_cpu.cc).
#include "zaya/ops/cca.h"

#include <initializer_list>
#include <tuple>
#include <utility>

#include "zaya/ops/cpu/cca_cpu.h"
#include "zaya/ops/cpu/op_checks.h"

namespace zaya::ops {

using seq::require_exact;
using seq::require_positive;
using seq::require_rows;

namespace {

void check_dims(std::string_view op, const CcaDims& d) {
  require_positive(op, "nq", d.nq);
  require_positive(op, "nkv", d.nkv);
  require_positive(op, "hd", d.hd);
  ZAYA_CHECK(d.nq % d.nkv == 0, op, ": nq (", d.nq, ") must be a multiple of nkv (", d.nkv, ")");
}

void check_conv_weights(std::string_view op, const CcaConvWeights& w, const CcaDims& d, const char* prefix) {
  const int64_t C = d.channels();
  require_exact(op, str(prefix, "conv_qk_depthwise.weight"), w.dw_weight, Shape{C, 1, 2});
  require_exact(op, str(prefix, "conv_qk_depthwise.bias"), w.dw_bias, Shape{C});
  require_exact(op, str(prefix, "conv_qk_grouped.weight"), w.gw_weight, Shape{C, d.hd, 2});
  require_exact(op, str(prefix, "conv_qk_grouped.bias"), w.gw_bias, Shape{C});
}

}  // namespace

void cca_conv_forward(Tensor& out, const Tensor& z, const CcaConvWeights& w, int64_t B, int64_t T,
                      const CcaDims& dims) {
  constexpr std::string_view op = "cca_conv_forward";
  check_dims(op, dims);
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  check_conv_weights(op, w, dims, "");
  require_rows(op, "z", z, B, T, dims.channels());
  require_rows(op, "out", out, B, T, dims.channels());
  ZAYA_CHECK(!out.shares_storage_with(z) || out.raw() != z.raw(), op, ": out must not alias z");
  cpu::cca_conv_fwd(out.data<float>(), z.data<float>(), w.dw_weight.data<float>(), w.dw_bias.data<float>(),
                    w.gw_weight.data<float>(), w.gw_bias.data<float>(), B, T, dims.heads(), dims.hd);
}

void cca_conv_backward(Tensor& dz, CcaConvWeights& grads, const Tensor& dout, const Tensor& z,
                       const CcaConvWeights& w, int64_t B, int64_t T, const CcaDims& dims,
                       bool accumulate_dz) {
  constexpr std::string_view op = "cca_conv_backward";
  check_dims(op, dims);
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  check_conv_weights(op, w, dims, "");
  check_conv_weights(op, grads, dims, "grad of ");
  require_rows(op, "dz", dz, B, T, dims.channels());
  require_rows(op, "dout", dout, B, T, dims.channels());
  require_rows(op, "z", z, B, T, dims.channels());
  cpu::cca_conv_bwd(dz.data<float>(), grads.dw_weight.data<float>(), grads.dw_bias.data<float>(),
                    grads.gw_weight.data<float>(), grads.gw_bias.data<float>(), dout.data<float>(),
                    z.data<float>(), w.dw_weight.data<float>(), w.dw_bias.data<float>(),
                    w.gw_weight.data<float>(), B, T, dims.heads(), dims.hd, accumulate_dz);
}

void cca_conv_decode(Tensor& out, Tensor& state, const Tensor& z_new, const CcaConvWeights& w, int64_t B,
                     const CcaDims& dims) {
  constexpr std::string_view op = "cca_conv_decode";
  check_dims(op, dims);
  require_positive(op, "B", B);
  check_conv_weights(op, w, dims, "");
  const int64_t C = dims.channels();
  require_rows(op, "out", out, B, 1, C);
  require_rows(op, "z_new", z_new, B, 1, C);
  require_exact(op, "state", state, Shape{B, 2, C});
  cpu::cca_conv_decode(out.data<float>(), state.data<float>(), z_new.data<float>(), w.dw_weight.data<float>(),
                       w.dw_bias.data<float>(), w.gw_weight.data<float>(), w.gw_bias.data<float>(), B,
                       dims.heads(), dims.hd);
}

void mean_skip_forward(Tensor& q, Tensor& k, const Tensor& conv, const Tensor& q_tilde, const Tensor& k_tilde,
                       int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "mean_skip_forward";
  check_dims(op, dims);
  require_positive(op, "N", N);
  seq::require_n_rows(op, "conv", conv, N, dims.channels());
  seq::require_n_rows(op, "q_tilde", q_tilde, N, dims.nq * dims.hd);
  seq::require_n_rows(op, "k_tilde", k_tilde, N, dims.nkv * dims.hd);
  seq::require_n_rows(op, "q", q, N, dims.nq * dims.hd);
  seq::require_n_rows(op, "k", k, N, dims.nkv * dims.hd);
  cpu::mean_skip_fwd(q.data<float>(), k.data<float>(), conv.data<float>(), q_tilde.data<float>(),
                     k_tilde.data<float>(), N, dims.nq, dims.nkv, dims.hd);
}

void mean_skip_backward(Tensor& dconv, Tensor& dq_tilde, Tensor& dk_tilde, const Tensor& dq, const Tensor& dk,
                        int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "mean_skip_backward";
  check_dims(op, dims);
  require_positive(op, "N", N);
  seq::require_n_rows(op, "dconv", dconv, N, dims.channels());
  seq::require_n_rows(op, "dq_tilde", dq_tilde, N, dims.nq * dims.hd);
  seq::require_n_rows(op, "dk_tilde", dk_tilde, N, dims.nkv * dims.hd);
  seq::require_n_rows(op, "dq", dq, N, dims.nq * dims.hd);
  seq::require_n_rows(op, "dk", dk, N, dims.nkv * dims.hd);
  cpu::mean_skip_bwd(dconv.data<float>(), dq_tilde.data<float>(), dk_tilde.data<float>(), dq.data<float>(),
                     dk.data<float>(), N, dims.nq, dims.nkv, dims.hd);
}

void value_shift_forward(Tensor& v, const Tensor& vcd, int64_t B, int64_t T, int64_t half) {
  constexpr std::string_view op = "value_shift_forward";
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  require_positive(op, "half", half);
  require_rows(op, "vcd", vcd, B, T, 2 * half);
  require_rows(op, "v", v, B, T, 2 * half);
  cpu::value_shift_fwd(v.data<float>(), vcd.data<float>(), B, T, half);
}

void value_shift_backward(Tensor& dvcd, const Tensor& dv, int64_t B, int64_t T, int64_t half) {
  constexpr std::string_view op = "value_shift_backward";
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  require_positive(op, "half", half);
  require_rows(op, "dvcd", dvcd, B, T, 2 * half);
  require_rows(op, "dv", dv, B, T, 2 * half);
  cpu::value_shift_bwd(dvcd.data<float>(), dv.data<float>(), B, T, half);
}

void value_shift_decode(Tensor& v, Tensor& state, const Tensor& vc, const Tensor& vd, int64_t B, int64_t half) {
  constexpr std::string_view op = "value_shift_decode";
  require_positive(op, "B", B);
  require_positive(op, "half", half);
  require_rows(op, "vc", vc, B, 1, half);
  require_rows(op, "vd", vd, B, 1, half);
  require_rows(op, "v", v, B, 1, 2 * half);
  require_exact(op, "state", state, Shape{B, half});
  cpu::value_shift_decode(v.data<float>(), state.data<float>(), vc.data<float>(), vd.data<float>(), B, half);
}

void qk_norm_forward(Tensor& q_out, Tensor& k_out, const Tensor& q, const Tensor& k, const Tensor& temp,
                     int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "qk_norm_forward";
  check_dims(op, dims);
  require_positive(op, "N", N);
  seq::require_n_rows(op, "q", q, N, dims.nq * dims.hd);
  seq::require_n_rows(op, "k", k, N, dims.nkv * dims.hd);
  seq::require_n_rows(op, "q_out", q_out, N, dims.nq * dims.hd);
  seq::require_n_rows(op, "k_out", k_out, N, dims.nkv * dims.hd);
  require_exact(op, "qk_norm.temp", temp, Shape{dims.nkv});
  cpu::qk_norm_fwd(q_out.data<float>(), k_out.data<float>(), q.data<float>(), k.data<float>(),
                   temp.data<float>(), N, dims.nq, dims.nkv, dims.hd);
}

void qk_norm_backward(Tensor& dq, Tensor& dk, Tensor& dtemp, const Tensor& dq_out, const Tensor& dk_out,
                      const Tensor& q, const Tensor& k, const Tensor& temp, int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "qk_norm_backward";
  check_dims(op, dims);
  require_positive(op, "N", N);
  for (auto [name, t, f] : std::initializer_list<std::tuple<const char*, const Tensor*, int64_t>>{{"dq", &dq, dims.nq}, {"dk", &dk, dims.nkv}, {"dq_out", &dq_out, dims.nq},
                            {"dk_out", &dk_out, dims.nkv}, {"q", &q, dims.nq}, {"k", &k, dims.nkv}})
    seq::require_n_rows(op, name, *t, N, f * dims.hd);
  require_exact(op, "qk_norm.temp", temp, Shape{dims.nkv});
  require_exact(op, "grad of qk_norm.temp", dtemp, Shape{dims.nkv});
  cpu::qk_norm_bwd(dq.data<float>(), dk.data<float>(), dtemp.data<float>(), dq_out.data<float>(),
                   dk_out.data<float>(), q.data<float>(), k.data<float>(), temp.data<float>(), N, dims.nq,
                   dims.nkv, dims.hd);
}

namespace {
// The checks both fused q/k ops share; returns N = B·T. `rows` are the [N, nq·hd] / [N, nkv·hd]
// operands (q-sized first, then k-sized, alternating), `conv_like` the [N, C] ones.
int64_t check_qk_path(std::string_view op, const CcaDims& dims, int64_t B, int64_t T, const Tensor& temp,
                      const RopeTable& rope, std::initializer_list<std::pair<const char*, const Tensor*>> conv_like,
                      std::initializer_list<std::tuple<const char*, const Tensor*, int64_t>> rows) {
  check_dims(op, dims);
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  const int64_t N = B * T;
  for (auto [name, t] : conv_like) seq::require_n_rows(op, name, *t, N, dims.channels());
  for (auto [name, t, f] : rows) seq::require_n_rows(op, name, *t, N, f * dims.hd);
  require_exact(op, "qk_norm.temp", temp, Shape{dims.nkv});
  ZAYA_CHECK(rope.rot >= 2 && rope.rot <= dims.hd, op, ": RoPE table has ", rope.rot, " rotary dims, head_dim is ",
             dims.hd);
  require_exact(op, "cos table", rope.cos, Shape{rope.max_positions(), rope.rot / 2});
  require_exact(op, "sin table", rope.sin, Shape{rope.max_positions(), rope.rot / 2});
  ZAYA_CHECK(T <= rope.max_positions(), op, ": positions up to ", T - 1, " exceed the RoPE table's ",
             rope.max_positions(), " positions (max_position_embeddings)");
  return N;
}
}  // namespace

void cca_qk_forward(Tensor& q, Tensor& k, Tensor& q_pre, Tensor& k_pre, const Tensor& conv, const Tensor& z,
                    const Tensor& temp, const RopeTable& rope, int64_t B, int64_t T, const CcaDims& dims) {
  check_qk_path("cca_qk_forward", dims, B, T, temp, rope, {{"conv", &conv}, {"z", &z}},
                {{"q", &q, dims.nq}, {"k", &k, dims.nkv}, {"q_pre", &q_pre, dims.nq}, {"k_pre", &k_pre, dims.nkv}});
  cpu::cca_qk_fwd(q.data<float>(), k.data<float>(), q_pre.data<float>(), k_pre.data<float>(), conv.data<float>(),
                  z.data<float>(), temp.data<float>(), rope.cos.data<float>(), rope.sin.data<float>(), rope.rot, B, T,
                  dims.nq, dims.nkv, dims.hd);
}

void cca_qk_backward(Tensor& dconv, Tensor& dz, Tensor& dtemp, const Tensor& dq, const Tensor& dk,
                     const Tensor& q_pre, const Tensor& k_pre, const Tensor& temp, const RopeTable& rope, int64_t B,
                     int64_t T, const CcaDims& dims) {
  check_qk_path("cca_qk_backward", dims, B, T, temp, rope, {{"dconv", &dconv}, {"dz", &dz}},
                {{"dq", &dq, dims.nq}, {"dk", &dk, dims.nkv}, {"q_pre", &q_pre, dims.nq}, {"k_pre", &k_pre, dims.nkv}});
  require_exact("cca_qk_backward", "grad of qk_norm.temp", dtemp, Shape{dims.nkv});
  cpu::cca_qk_bwd(dconv.data<float>(), dz.data<float>(), dtemp.data<float>(), dq.data<float>(), dk.data<float>(),
                  q_pre.data<float>(), k_pre.data<float>(), temp.data<float>(), rope.cos.data<float>(),
                  rope.sin.data<float>(), rope.rot, B, T, dims.nq, dims.nkv, dims.hd);
}

}  // namespace zaya::ops
