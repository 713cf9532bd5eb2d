// CCA (compressed convolutional attention) pieces of the ZAYA1 attention block, forward and
// backward: the two causal sequence convolutions over concat(q̃, k̃), the mean skip, the value
// shift and the QK L2 norm with the key temperature (DESIGN.md, "The ZAYA1 model, exactly",
// steps 1-5). Math matches transformers' ZayaCCAProjection and ZayaQKNorm in fp32.
//
// Conventions (all sequence ops): activations are contiguous row-major [B, T, F] (or [B·T, F], or
// [B, T, heads, hd]); outputs are preallocated by the caller; parameter gradients ACCUMULATE (+=),
// activation gradients are WRITTEN. Kernels: cpu/cca_cpu.cc and cuda/cca.cu. Results are bitwise
// identical across runs and thread counts (fixed reduction orders, no atomics).
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"
#include "zaya/ops/rope.h"

namespace zaya::ops {

// Head layout of the CCA block: C = (nq + nkv)·hd conv channels (the nq query heads, then the nkv
// key heads), one grouped-conv group per head.
struct CcaDims {
  int64_t nq = 0, nkv = 0, hd = 0;
  int64_t heads() const { return nq + nkv; }
  int64_t channels() const { return (nq + nkv) * hd; }
};

// The conv weights in Hugging Face layout: depthwise weight [C, 1, 2] and bias [C]
// (conv_qk_depthwise), grouped weight [C, hd, 2] and bias [C] (conv_qk_grouped). Tap 1 multiplies
// the newer sample (cross-correlation, as torch's Conv1d).
struct CcaConvWeights {
  Tensor dw_weight, dw_bias, gw_weight, gw_bias;
};

// out = grouped(depthwise(pad2(z))): z [B, T, C] → out [B, T, C]. The sequence is left-padded once
// with 2 zero time steps, so the depthwise output at the first padded slot is its bias alone and
// feeds the grouped conv at t = 0; token t sees z_{t-2}, z_{t-1}, z_t.
void cca_conv_forward(const Tensor& out, const Tensor& z, const CcaConvWeights& w, int64_t B, int64_t T,
                      const CcaDims& dims);
// dz written (or, with accumulate_dz, added to dz: the mean skip's part of z's gradient already
// there); the four weight gradients (same shapes as the weights) accumulated.
void cca_conv_backward(const Tensor& dz, const CcaConvWeights& grads, const Tensor& dout, const Tensor& z,
                       const CcaConvWeights& w, int64_t B, int64_t T, const CcaDims& dims,
                       bool accumulate_dz = false);
// One decode step. state [B, 2, C] holds the last two pre-conv columns of z (oldest first; zeros
// before the first token, which is exactly the padding). z_new [B, C] → out [B, C]; state shifts.
void cca_conv_decode(const Tensor& out, const Tensor& state, const Tensor& z_new, const CcaConvWeights& w,
                     int64_t B, const CcaDims& dims);

// Mean skip + residual add, per token (rows N = B·T):
//   m_q^h = ½(q̃^h + k̃^j) for q head h in kv group j = ⌊h/G⌋, m_k^j = mean_{h in j} m_q^h,
//   q = conv[:, :nq·hd] + m_q, k = conv[:, nq·hd:] + m_k.
// conv [N, C], q_tilde [N, nq·hd], k_tilde [N, nkv·hd] → q [N, nq·hd], k [N, nkv·hd].
void mean_skip_forward(const Tensor& q, const Tensor& k, const Tensor& conv, const Tensor& q_tilde,
                       const Tensor& k_tilde, int64_t N, const CcaDims& dims);
void mean_skip_backward(const Tensor& dconv, const Tensor& dq_tilde, const Tensor& dk_tilde, const Tensor& dq,
                        const Tensor& dk, int64_t N, const CcaDims& dims);

// Value shift: v_t = concat(vc_t, vd_{t-1}), vd_{-1} = 0. vcd [B, T, 2·half] holds the row
// [vc_t | vd_t] (the value projections side by side, as one product writes them) → v [B, T, 2·half]
// (half = nkv·hd/2). No state crosses batch rows.
void value_shift_forward(const Tensor& v, const Tensor& vcd, int64_t B, int64_t T, int64_t half);
// dvcd [B, T, 2·half] written: [dvc_t | dvd_t] = [dv_t[:half] | dv_{t+1}[half:]], dvd 0 at a row's end.
void value_shift_backward(const Tensor& dvcd, const Tensor& dv, int64_t B, int64_t T, int64_t half);
// Decode: state [B, half] is the previous token's vd (zeros before the first token); vc, vd [B, half]
// → v [B, 2·half]; state ← vd.
void value_shift_decode(const Tensor& v, const Tensor& state, const Tensor& vc, const Tensor& vd, int64_t B, int64_t half);

// QK norm: per head, q ← q·√hd / max(‖q‖₂, ε), k ← k·√hd / max(‖k‖₂, ε) · τ_j with ε = FLT_EPSILON
// (torch.finfo(float32).eps, as the reference) and τ [nkv] used linearly. q [N, nq·hd],
// k [N, nkv·hd]; outputs separate from inputs (backward needs the inputs).
void qk_norm_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k, const Tensor& temp,
                     int64_t N, const CcaDims& dims);
// dq, dk written; dtemp [nkv] accumulated.
void qk_norm_backward(const Tensor& dq, const Tensor& dk, const Tensor& dtemp, const Tensor& dq_out, const Tensor& dk_out,
                      const Tensor& q, const Tensor& k, const Tensor& temp, int64_t N, const CcaDims& dims);

// The q/k path after the conv, fused per token: mean skip → QK norm → RoPE at positions 0..T−1,
// the same values bit for bit as mean_skip_forward, qk_norm_forward and rope_forward on q and on k
// in turn, in one pass while each token's rows are in L1. z [B·T, C] is the conv's input, whose rows
// are [q̃ | k̃] (the mean skip reads them there: no separate copies). Writes q_pre, k_pre (the QK
// norm's inputs, which the backward needs) and q, k [B·T, nq·hd] / [B·T, nkv·hd] (attention's).
void cca_qk_forward(const Tensor& q, const Tensor& k, const Tensor& q_pre, const Tensor& k_pre, const Tensor& conv, const Tensor& z,
                    const Tensor& temp, const RopeTable& rope, int64_t B, int64_t T, const CcaDims& dims);
// Its backward from dq, dk (unchanged): dconv written, dz [B·T, C] written with the gradient that
// reaches z through the mean skip ([dq̃ | dk̃] per row), dtemp accumulated; as rope_backward,
// qk_norm_backward and mean_skip_backward in turn.
void cca_qk_backward(const Tensor& dconv, const Tensor& dz, const Tensor& dtemp, const Tensor& dq, const Tensor& dk,
                     const Tensor& q_pre, const Tensor& k_pre, const Tensor& temp, const RopeTable& rope, int64_t B,
                     int64_t T, const CcaDims& dims);

}  // namespace zaya::ops
