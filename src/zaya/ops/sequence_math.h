// The per-element math of the sequence ops (RoPE, the CCA block's depthwise convolution, mean skip
// and QK norm, attention's probabilities), as __host__ __device__ functions: the CUDA kernels
// (ops/cuda/rope.cu, cca.cu, attention.cu) call them on the device, and the CPU tests call the same
// functions on the host against the CPU ops (tests/ops/test_sequence_math.cc), so what a GPU runs is
// tested on machines without one.
//
// Each function does the CPU kernel's float operations in the CPU kernel's order. g++ compiles the
// CPU kernels without contracting a·b + c into one FMA (ISO C++ mode), while nvcc contracts by
// default; mul() and the explicit fmaf() below pin the rounding so that the device computes the
// CPU's bits wherever no reduction order differs (RoPE, the mean skip, the depthwise taps).
#pragma once

#include <float.h>
#include <math.h>

#include "zaya/core/dtype.h"  // ZAYA_HD

namespace zaya::ops::math {

// a·b rounded on its own, never fused into a following addition (the CPU kernels' rounding).
ZAYA_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// ---------------------------------------------------------------------------------------------
// RoPE, rotate-half: the pair (x_j, x_{j+rot/2}) rotated by sign·φ_j, with c = cos φ_j, s = sin φ_j
// (sign −1 is the backward, the inverse rotation).
struct Pair {
  float lo, hi;
};
ZAYA_HD inline Pair rope_rotate(float a, float b, float c, float s, float sign) {
  const float sn = sign * s;
  return {mul(a, c) - mul(b, sn), mul(b, c) + mul(a, sn)};
}

// ---------------------------------------------------------------------------------------------
// CCA depthwise convolution, one channel at slot s: d_s = db + dw0·z_{s-2} + dw1·z_{s-1}, as the CPU's
// fma(w1, z_{s-1}, fma(w0, z_{s-2}, db)) (zeros before the sequence: the single left pad).
ZAYA_HD inline float depthwise_slot(float zm2, float zm1, float w0, float w1, float db) {
  return fmaf(w1, zm1, fmaf(w0, zm2, db));
}
// Its gradient into z_t from the total gradients G of the slots z_t feeds: slot t+1 (tap 1) and
// slot t+2 (tap 0): dz_t = G_{t+2}·dw0 + G_{t+1}·dw1.
ZAYA_HD inline float depthwise_input_grad(float g_next2, float g_next1, float w0, float w1) {
  return fmaf(g_next2, w0, g_next1 * w1);
}

// ---------------------------------------------------------------------------------------------
// Mean skip, one element d of q head h in kv group j: m = ½(q̃^h + k̃^j), q = conv_q + m; the key's
// k = conv_k + (Σ_h m)/G with the m summed in head order by the caller.
ZAYA_HD inline float mean_skip_m(float q_tilde, float k_tilde) { return (q_tilde + k_tilde) * 0.5f; }
ZAYA_HD inline float mean_skip_key(float conv_k, float m_sum, float inv_g) { return conv_k + mul(m_sum, inv_g); }
// Backward: dm^h = dq^h + dk^j/G; dq̃^h = ½dm^h; dk̃^j = ½ Σ_h dm^h (summed in head order).
ZAYA_HD inline float mean_skip_dm(float dq, float dk, float inv_g) { return dq + mul(dk, inv_g); }

// ---------------------------------------------------------------------------------------------
// QK norm: y = x·s (·τ for keys) with s = √hd / max(‖x‖, ε), ε = FLT_EPSILON.
ZAYA_HD inline float qk_norm_scale(float norm, float sqrt_hd) { return sqrt_hd / fmaxf(norm, FLT_EPSILON); }
// Its backward for one element, from the row's norm n = ‖x‖ and proj = τ·⟨x, dy⟩/n² (n > ε):
// dx = (√hd/n)·(τ·dy − x·proj); below ε the scale is the constant √hd/ε: dx = (√hd/ε)·τ·dy.
ZAYA_HD inline float qk_norm_input_grad(float x, float dy, float tau, float norm, float proj, float sqrt_hd) {
  if (norm > FLT_EPSILON) return (sqrt_hd / norm) * (mul(tau, dy) - mul(x, proj));
  return mul(sqrt_hd / FLT_EPSILON, tau) * dy;
}
ZAYA_HD inline float qk_norm_proj(float tau, float x_dot_dy, float norm) { return tau * x_dot_dy / (norm * norm); }

// ---------------------------------------------------------------------------------------------
// Attention: the probability of a key from its raw score q·k, the scale 1/√hd and the row's
// log-sum-exp; and the softmax gradient dS = P·(dP − D) with dP = ⟨dO, v⟩, D = ⟨dO, O⟩.
ZAYA_HD inline float attention_prob(float score, float scale, float lse) { return expf(score * scale - lse); }
ZAYA_HD inline float attention_dscore(float p, float dp, float d) { return p * (dp - d); }

// Merging two partial attentions of one query over disjoint key sets (online softmax): with their
// log-sum-exps a, b the merged one is L = m + log(e^(a−m) + e^(b−m)), m = max(a, b), and the output
// is wa·Oa + wb·Ob with wa = e^(a−m)/s, wb = e^(b−m)/s, s the sum. A part with no keys has lse −∞
// and weight 0 (both −∞: no keys at all, which callers never merge).
struct SoftmaxMerge {
  float lse, wa, wb;
};
ZAYA_HD inline SoftmaxMerge softmax_merge(float a, float b) {
  const float m = fmaxf(a, b), ea = expf(a - m), eb = expf(b - m), s = ea + eb;
  return {m + logf(s), ea / s, eb / s};
}
ZAYA_HD inline float softmax_merge_out(const SoftmaxMerge& w, float oa, float ob) { return mul(w.wa, oa) + mul(w.wb, ob); }

}  // namespace zaya::ops::math
