// CUDA kernels behind zaya/ops/rope.h (rope.cu), zaya/ops/cca.h (cca.cu) and zaya/ops/attention.h
// (attention.cu), with the fronts' signatures; the fronts check the arguments and call these for
// CUDA tensors. A plain C++ header (no CUDA types), included only where the build has CUDA
// (ZAYA_HAVE_CUDA).
//
// fp32 tensors, as the CPU kernels take them. Every kernel runs on the calling thread's device
// context (core/cuda_context.h), never synchronizes with the host and reads no tensor memory on the
// host; without a GPU each throws a zaya::Error naming the op. No atomics: parameter gradients are
// column sums in orders fixed by the shapes, bitwise the same run to run.
#pragma once

#include <cstdint>
#include <string>

#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/rope.h"

namespace zaya::ops::cuda {

// rope.cu. sign +1 rotates by φ (forward), −1 by −φ (backward); y may be x.
void rope_apply(const Tensor& y, const Tensor& x, const RopeTable& table, int64_t B, int64_t T, int64_t heads,
                int64_t hd, int64_t pos_offset, float sign);

// cca.cu
void cca_conv_forward(const Tensor& out, const Tensor& z, const CcaConvWeights& w, int64_t B, int64_t T,
                      const CcaDims& dims);
void cca_conv_backward(const Tensor& dz, const CcaConvWeights& grads, const Tensor& dout, const Tensor& z,
                       const CcaConvWeights& w, int64_t B, int64_t T, const CcaDims& dims, bool accumulate_dz);
void cca_conv_decode(const Tensor& out, const Tensor& state, const Tensor& z_new, const CcaConvWeights& w,
                     int64_t B, const CcaDims& dims);
void mean_skip_forward(const Tensor& q, const Tensor& k, const Tensor& conv, const Tensor& q_tilde,
                       const Tensor& k_tilde, int64_t N, const CcaDims& dims);
void mean_skip_backward(const Tensor& dconv, const Tensor& dq_tilde, const Tensor& dk_tilde, const Tensor& dq,
                        const Tensor& dk, int64_t N, const CcaDims& dims);
void value_shift_forward(const Tensor& v, const Tensor& vcd, int64_t B, int64_t T, int64_t half);
void value_shift_backward(const Tensor& dvcd, const Tensor& dv, int64_t B, int64_t T, int64_t half);
void value_shift_decode(const Tensor& v, const Tensor& state, const Tensor& vc, const Tensor& vd, int64_t B,
                        int64_t half);
void qk_norm_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k, const Tensor& temp,
                     int64_t N, const CcaDims& dims);
void qk_norm_backward(const Tensor& dq, const Tensor& dk, const Tensor& dtemp, const Tensor& dq_out,
                      const Tensor& dk_out, const Tensor& q, const Tensor& k, const Tensor& temp, int64_t N,
                      const CcaDims& dims);
void cca_qk_forward(const Tensor& q, const Tensor& k, const Tensor& q_pre, const Tensor& k_pre, const Tensor& conv,
                    const Tensor& z, const Tensor& temp, const RopeTable& rope, int64_t B, int64_t T,
                    const CcaDims& dims);
void cca_qk_backward(const Tensor& dconv, const Tensor& dz, const Tensor& dtemp, const Tensor& dq, const Tensor& dk,
                     const Tensor& q_pre, const Tensor& k_pre, const Tensor& temp, const RopeTable& rope, int64_t B,
                     int64_t T, const CcaDims& dims);

// attention.cu. Two implementations of the training forward and backward (docs/cuda.md,
// "Attention"): cuDNN's fused SDPA in bf16 (the default where the build has cudnn-frontend and the
// machine's cuDNN loads) and the fp32 reference kernels. The decode step always runs the reference.
enum class AttentionImpl { reference, cudnn };
// The implementation the fronts use on this thread: set_attention_impl's, else the environment's
// ZAYA_CUDA_ATTENTION=reference|cudnn, else cuDNN where it is available and the reference otherwise.
AttentionImpl attention_impl();
// Chooses the implementation for the calling thread; cudnn where it is unavailable throws naming why.
void set_attention_impl(AttentionImpl impl);
const char* attention_impl_name(AttentionImpl impl);
// Whether cuDNN's SDPA can run here; `why` says why not (built without cudnn-frontend, libcudnn not
// found, no GPU, a head_dim cuDNN does not take).
bool cudnn_attention_available(std::string* why = nullptr);

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                        int64_t T, int64_t nq, int64_t nkv, int64_t hd);
void attention_decode(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t B,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd);
// The positioned forms (context parallelism): always the fp32 reference kernels; dk, dv accumulated.
void attention_at_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                          int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd);
void attention_at_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                           const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                           int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd,
                           bool accumulate_dq);
// Every query against every key (the keys before a chunk); dq, dk, dv accumulated.
void attention_prefix_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv, int64_t hd);
void attention_prefix_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv,
                               int64_t hd);
void attention_merge(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                     int64_t T, int64_t nq, int64_t hd);

}  // namespace zaya::ops::cuda
