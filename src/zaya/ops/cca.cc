// Argument checks and dispatch for the CCA ops (math in cpu/cca_cpu.cc).
#include "zaya/ops/cca.h"

#include <initializer_list>
#include <tuple>
#include <utility>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/cca_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/sequence_cuda.h"
#endif

namespace zaya::ops {

namespace {

void check_dims(std::string_view op, const CcaDims& d) {
  check::positive(op, "nq", d.nq);
  check::positive(op, "nkv", d.nkv);
  check::positive(op, "hd", d.hd);
  ZAYA_CHECK(d.nq % d.nkv == 0, op, ": nq (", d.nq, ") must be a multiple of nkv (", d.nkv, ")");
}

void check_conv_weights(std::string_view op, const CcaConvWeights& w, const CcaDims& d, const char* prefix) {
  const int64_t C = d.channels();
  check::exact(op, str(prefix, "conv_qk_depthwise.weight"), w.dw_weight, Shape{C, 1, 2});
  check::exact(op, str(prefix, "conv_qk_depthwise.bias"), w.dw_bias, Shape{C});
  check::exact(op, str(prefix, "conv_qk_grouped.weight"), w.gw_weight, Shape{C, d.hd, 2});
  check::exact(op, str(prefix, "conv_qk_grouped.bias"), w.gw_bias, Shape{C});
}

}  // namespace

void cca_conv_forward(const Tensor& out, const Tensor& z, const CcaConvWeights& w, int64_t B, int64_t T,
                      const CcaDims& dims) {
  constexpr std::string_view op = "cca_conv_forward";
  const OpDevice on(op, {{"out", out},
                         {"z", z},
                         {"conv_qk_depthwise.weight", w.dw_weight},
                         {"conv_qk_depthwise.bias", w.dw_bias},
                         {"conv_qk_grouped.weight", w.gw_weight},
                         {"conv_qk_grouped.bias", w.gw_bias}});
  check_dims(op, dims);
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  check_conv_weights(op, w, dims, "");
  check::rows(op, "z", z, B, T, dims.channels());
  check::rows(op, "out", out, B, T, dims.channels());
  ZAYA_CHECK(!out.shares_storage_with(z) || out.raw() != z.raw(), op, ": out must not alias z");
  if (on.cpu())
    return cpu::cca_conv_fwd(out.data<float>(), z.data<float>(), w.dw_weight.data<float>(),
                             w.dw_bias.data<float>(), w.gw_weight.data<float>(), w.gw_bias.data<float>(), B,
                             T, dims.heads(), dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cca_conv_forward(out, z, w, B, T, dims);
#endif
  on.no_kernel();
}

void cca_conv_backward(const Tensor& dz, const CcaConvWeights& grads, const Tensor& dout, const Tensor& z,
                       const CcaConvWeights& w, int64_t B, int64_t T, const CcaDims& dims,
                       bool accumulate_dz) {
  constexpr std::string_view op = "cca_conv_backward";
  const OpDevice on(op, {{"dz", dz},
                         {"grad of conv_qk_depthwise.weight", grads.dw_weight},
                         {"grad of conv_qk_depthwise.bias", grads.dw_bias},
                         {"grad of conv_qk_grouped.weight", grads.gw_weight},
                         {"grad of conv_qk_grouped.bias", grads.gw_bias},
                         {"dout", dout},
                         {"z", z},
                         {"conv_qk_depthwise.weight", w.dw_weight},
                         {"conv_qk_depthwise.bias", w.dw_bias},
                         {"conv_qk_grouped.weight", w.gw_weight},
                         {"conv_qk_grouped.bias", w.gw_bias}});
  check_dims(op, dims);
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  check_conv_weights(op, w, dims, "");
  check_conv_weights(op, grads, dims, "grad of ");
  check::rows(op, "dz", dz, B, T, dims.channels());
  check::rows(op, "dout", dout, B, T, dims.channels());
  check::rows(op, "z", z, B, T, dims.channels());
  if (on.cpu())
    return cpu::cca_conv_bwd(dz.data<float>(), grads.dw_weight.data<float>(), grads.dw_bias.data<float>(),
                             grads.gw_weight.data<float>(), grads.gw_bias.data<float>(), dout.data<float>(),
                             z.data<float>(), w.dw_weight.data<float>(), w.dw_bias.data<float>(),
                             w.gw_weight.data<float>(), B, T, dims.heads(), dims.hd, accumulate_dz);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cca_conv_backward(dz, grads, dout, z, w, B, T, dims, accumulate_dz);
#endif
  on.no_kernel();
}

void cca_conv_decode(const Tensor& out, const Tensor& state, const Tensor& z_new, const CcaConvWeights& w, int64_t B,
                     const CcaDims& dims) {
  constexpr std::string_view op = "cca_conv_decode";
  const OpDevice on(op, {{"out", out},
                         {"state", state},
                         {"z_new", z_new},
                         {"conv_qk_depthwise.weight", w.dw_weight},
                         {"conv_qk_depthwise.bias", w.dw_bias},
                         {"conv_qk_grouped.weight", w.gw_weight},
                         {"conv_qk_grouped.bias", w.gw_bias}});
  check_dims(op, dims);
  check::positive(op, "B", B);
  check_conv_weights(op, w, dims, "");
  const int64_t C = dims.channels();
  check::rows(op, "out", out, B, 1, C);
  check::rows(op, "z_new", z_new, B, 1, C);
  check::exact(op, "state", state, Shape{B, 2, C});
  if (on.cpu())
    return cpu::cca_conv_decode(out.data<float>(), state.data<float>(), z_new.data<float>(),
                                w.dw_weight.data<float>(), w.dw_bias.data<float>(), w.gw_weight.data<float>(),
                                w.gw_bias.data<float>(), B, dims.heads(), dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cca_conv_decode(out, state, z_new, w, B, dims);
#endif
  on.no_kernel();
}

void mean_skip_forward(const Tensor& q, const Tensor& k, const Tensor& conv, const Tensor& q_tilde, const Tensor& k_tilde,
                       int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "mean_skip_forward";
  const OpDevice on(op, {{"q", q}, {"k", k}, {"conv", conv}, {"q_tilde", q_tilde}, {"k_tilde", k_tilde}});
  check_dims(op, dims);
  check::positive(op, "N", N);
  check::n_rows(op, "conv", conv, N, dims.channels());
  check::n_rows(op, "q_tilde", q_tilde, N, dims.nq * dims.hd);
  check::n_rows(op, "k_tilde", k_tilde, N, dims.nkv * dims.hd);
  check::n_rows(op, "q", q, N, dims.nq * dims.hd);
  check::n_rows(op, "k", k, N, dims.nkv * dims.hd);
  if (on.cpu())
    return cpu::mean_skip_fwd(q.data<float>(), k.data<float>(), conv.data<float>(), q_tilde.data<float>(),
                              k_tilde.data<float>(), N, dims.nq, dims.nkv, dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::mean_skip_forward(q, k, conv, q_tilde, k_tilde, N, dims);
#endif
  on.no_kernel();
}

void mean_skip_backward(const Tensor& dconv, const Tensor& dq_tilde, const Tensor& dk_tilde, const Tensor& dq, const Tensor& dk,
                        int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "mean_skip_backward";
  const OpDevice on(
      op, {{"dconv", dconv}, {"dq_tilde", dq_tilde}, {"dk_tilde", dk_tilde}, {"dq", dq}, {"dk", dk}});
  check_dims(op, dims);
  check::positive(op, "N", N);
  check::n_rows(op, "dconv", dconv, N, dims.channels());
  check::n_rows(op, "dq_tilde", dq_tilde, N, dims.nq * dims.hd);
  check::n_rows(op, "dk_tilde", dk_tilde, N, dims.nkv * dims.hd);
  check::n_rows(op, "dq", dq, N, dims.nq * dims.hd);
  check::n_rows(op, "dk", dk, N, dims.nkv * dims.hd);
  if (on.cpu())
    return cpu::mean_skip_bwd(dconv.data<float>(), dq_tilde.data<float>(), dk_tilde.data<float>(),
                              dq.data<float>(), dk.data<float>(), N, dims.nq, dims.nkv, dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::mean_skip_backward(dconv, dq_tilde, dk_tilde, dq, dk, N, dims);
#endif
  on.no_kernel();
}

void value_shift_forward(const Tensor& v, const Tensor& vcd, int64_t B, int64_t T, int64_t half) {
  constexpr std::string_view op = "value_shift_forward";
  const OpDevice on(op, {{"v", v}, {"vcd", vcd}});
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  check::positive(op, "half", half);
  check::rows(op, "vcd", vcd, B, T, 2 * half);
  check::rows(op, "v", v, B, T, 2 * half);
  if (on.cpu()) return cpu::value_shift_fwd(v.data<float>(), vcd.data<float>(), B, T, half);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::value_shift_forward(v, vcd, B, T, half);
#endif
  on.no_kernel();
}

void value_shift_backward(const Tensor& dvcd, const Tensor& dv, int64_t B, int64_t T, int64_t half) {
  constexpr std::string_view op = "value_shift_backward";
  const OpDevice on(op, {{"dvcd", dvcd}, {"dv", dv}});
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  check::positive(op, "half", half);
  check::rows(op, "dvcd", dvcd, B, T, 2 * half);
  check::rows(op, "dv", dv, B, T, 2 * half);
  if (on.cpu()) return cpu::value_shift_bwd(dvcd.data<float>(), dv.data<float>(), B, T, half);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::value_shift_backward(dvcd, dv, B, T, half);
#endif
  on.no_kernel();
}

void value_shift_decode(const Tensor& v, const Tensor& state, const Tensor& vc, const Tensor& vd, int64_t B,
                        int64_t half) {
  constexpr std::string_view op = "value_shift_decode";
  const OpDevice on(op, {{"v", v}, {"state", state}, {"vc", vc}, {"vd", vd}});
  check::positive(op, "B", B);
  check::positive(op, "half", half);
  check::rows(op, "vc", vc, B, 1, half);
  check::rows(op, "vd", vd, B, 1, half);
  check::rows(op, "v", v, B, 1, 2 * half);
  check::exact(op, "state", state, Shape{B, half});
  if (on.cpu())
    return cpu::value_shift_decode(v.data<float>(), state.data<float>(), vc.data<float>(), vd.data<float>(),
                                   B, half);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::value_shift_decode(v, state, vc, vd, B, half);
#endif
  on.no_kernel();
}

void qk_norm_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k, const Tensor& temp,
                     int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "qk_norm_forward";
  const OpDevice on(op, {{"q_out", q_out}, {"k_out", k_out}, {"q", q}, {"k", k}, {"qk_norm.temp", temp}});
  check_dims(op, dims);
  check::positive(op, "N", N);
  check::n_rows(op, "q", q, N, dims.nq * dims.hd);
  check::n_rows(op, "k", k, N, dims.nkv * dims.hd);
  check::n_rows(op, "q_out", q_out, N, dims.nq * dims.hd);
  check::n_rows(op, "k_out", k_out, N, dims.nkv * dims.hd);
  check::exact(op, "qk_norm.temp", temp, Shape{dims.nkv});
  if (on.cpu())
    return cpu::qk_norm_fwd(q_out.data<float>(), k_out.data<float>(), q.data<float>(), k.data<float>(),
                            temp.data<float>(), N, dims.nq, dims.nkv, dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::qk_norm_forward(q_out, k_out, q, k, temp, N, dims);
#endif
  on.no_kernel();
}

void qk_norm_backward(const Tensor& dq, const Tensor& dk, const Tensor& dtemp, const Tensor& dq_out, const Tensor& dk_out,
                      const Tensor& q, const Tensor& k, const Tensor& temp, int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "qk_norm_backward";
  const OpDevice on(op, {{"dq", dq},
                         {"dk", dk},
                         {"grad of qk_norm.temp", dtemp},
                         {"dq_out", dq_out},
                         {"dk_out", dk_out},
                         {"q", q},
                         {"k", k},
                         {"qk_norm.temp", temp}});
  check_dims(op, dims);
  check::positive(op, "N", N);
  for (auto [name, t, f] :
       std::initializer_list<std::tuple<const char*, const Tensor*, int64_t>>{{"dq", &dq, dims.nq},
                                                                              {"dk", &dk, dims.nkv},
                                                                              {"dq_out", &dq_out, dims.nq},
                                                                              {"dk_out", &dk_out, dims.nkv},
                                                                              {"q", &q, dims.nq},
                                                                              {"k", &k, dims.nkv}})
    check::n_rows(op, name, *t, N, f * dims.hd);
  check::exact(op, "qk_norm.temp", temp, Shape{dims.nkv});
  check::exact(op, "grad of qk_norm.temp", dtemp, Shape{dims.nkv});
  if (on.cpu())
    return cpu::qk_norm_bwd(dq.data<float>(), dk.data<float>(), dtemp.data<float>(), dq_out.data<float>(),
                            dk_out.data<float>(), q.data<float>(), k.data<float>(), temp.data<float>(), N,
                            dims.nq, dims.nkv, dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::qk_norm_backward(dq, dk, dtemp, dq_out, dk_out, q, k, temp, N, dims);
#endif
  on.no_kernel();
}

namespace {
// The checks both fused q/k ops share; returns N = B·T. `rows` are the [N, nq·hd] / [N, nkv·hd]
// operands (q-sized first, then k-sized, alternating), `conv_like` the [N, C] ones.
int64_t check_qk_path(std::string_view op, const CcaDims& dims, int64_t B, int64_t T, const Tensor& temp,
                      const RopeTable& rope,
                      std::initializer_list<std::pair<const char*, const Tensor*>> conv_like,
                      std::initializer_list<std::tuple<const char*, const Tensor*, int64_t>> rows) {
  check_dims(op, dims);
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  const int64_t N = B * T;
  for (auto [name, t] : conv_like) check::n_rows(op, name, *t, N, dims.channels());
  for (auto [name, t, f] : rows) check::n_rows(op, name, *t, N, f * dims.hd);
  check::exact(op, "qk_norm.temp", temp, Shape{dims.nkv});
  ZAYA_CHECK(rope.rot >= 2 && rope.rot <= dims.hd, op, ": RoPE table has ", rope.rot,
             " rotary dims, head_dim is ", dims.hd);
  check::exact(op, "cos table", rope.cos, Shape{rope.max_positions(), rope.rot / 2});
  check::exact(op, "sin table", rope.sin, Shape{rope.max_positions(), rope.rot / 2});
  ZAYA_CHECK(T <= rope.max_positions(), op, ": positions up to ", T - 1, " exceed the RoPE table's ",
             rope.max_positions(), " positions (max_position_embeddings)");
  return N;
}
}  // namespace

void cca_qk_forward(const Tensor& q, const Tensor& k, const Tensor& q_pre, const Tensor& k_pre, const Tensor& conv, const Tensor& z,
                    const Tensor& temp, const RopeTable& rope, int64_t B, int64_t T, const CcaDims& dims) {
  constexpr std::string_view op = "cca_qk_forward";
  const OpDevice on(op, {{"q", q},
                         {"k", k},
                         {"q_pre", q_pre},
                         {"k_pre", k_pre},
                         {"conv", conv},
                         {"z", z},
                         {"qk_norm.temp", temp},
                         {"cos table", rope.cos},
                         {"sin table", rope.sin}});
  check_qk_path(
      op, dims, B, T, temp, rope, {{"conv", &conv}, {"z", &z}},
      {{"q", &q, dims.nq}, {"k", &k, dims.nkv}, {"q_pre", &q_pre, dims.nq}, {"k_pre", &k_pre, dims.nkv}});
  if (on.cpu())
    return cpu::cca_qk_fwd(q.data<float>(), k.data<float>(), q_pre.data<float>(), k_pre.data<float>(),
                           conv.data<float>(), z.data<float>(), temp.data<float>(), rope.cos.data<float>(),
                           rope.sin.data<float>(), rope.rot, B, T, dims.nq, dims.nkv, dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cca_qk_forward(q, k, q_pre, k_pre, conv, z, temp, rope, B, T, dims);
#endif
  on.no_kernel();
}

void cca_qk_backward(const Tensor& dconv, const Tensor& dz, const Tensor& dtemp, const Tensor& dq, const Tensor& dk,
                     const Tensor& q_pre, const Tensor& k_pre, const Tensor& temp, const RopeTable& rope,
                     int64_t B, int64_t T, const CcaDims& dims) {
  constexpr std::string_view op = "cca_qk_backward";
  const OpDevice on(op, {{"dconv", dconv},
                         {"dz", dz},
                         {"grad of qk_norm.temp", dtemp},
                         {"dq", dq},
                         {"dk", dk},
                         {"q_pre", q_pre},
                         {"k_pre", k_pre},
                         {"qk_norm.temp", temp},
                         {"cos table", rope.cos},
                         {"sin table", rope.sin}});
  check_qk_path(
      op, dims, B, T, temp, rope, {{"dconv", &dconv}, {"dz", &dz}},
      {{"dq", &dq, dims.nq}, {"dk", &dk, dims.nkv}, {"q_pre", &q_pre, dims.nq}, {"k_pre", &k_pre, dims.nkv}});
  check::exact(op, "grad of qk_norm.temp", dtemp, Shape{dims.nkv});
  if (on.cpu())
    return cpu::cca_qk_bwd(dconv.data<float>(), dz.data<float>(), dtemp.data<float>(), dq.data<float>(),
                           dk.data<float>(), q_pre.data<float>(), k_pre.data<float>(), temp.data<float>(),
                           rope.cos.data<float>(), rope.sin.data<float>(), rope.rot, B, T, dims.nq, dims.nkv,
                           dims.hd);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cca_qk_backward(dconv, dz, dtemp, dq, dk, q_pre, k_pre, temp, rope, B, T, dims);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
