// cuDNN's fused SDPA (scaled dot-product attention) through the header-only cudnn-frontend, behind
// the CUDA attention kernels of attention.cu (attention_cudnn_cuda.cc). A plain C++ header.
//
// cuDNN's flash attention takes bf16 (or fp16) q, k, v, O and dO; the model's tensors are fp32, so
// these convert them into bf16 scratch around the fused kernels (attention.cu's conversion kernels)
// and write fp32 out, lse, dq, dk, dv. Graphs are built once per shape and thread and cached. The
// build defines ZAYA_HAVE_CUDNN_FRONTEND where it found cudnn-frontend's headers; libcudnn is
// loaded at run time (dlopen), so a machine without cuDNN runs everything else and reports why.
#pragma once

#include <cstdint>
#include <string>

namespace zaya::ops::cuda::cudnn_sdpa {

// Whether cuDNN's SDPA can run on this thread's device; `why` says why not.
bool available(std::string* why);
// Describes the forward and backward graphs of a shape and runs cudnn-frontend's validation for a
// GPU of compute capability sm_version (90: Hopper) without building them: no GPU needed, only
// libcudnn (the frontend asks it for its version). "" when both validate, else the first error.
std::string validate_graphs(int sm_version, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd);
// cuDNN's bf16 flash attention takes head dims that are multiples of 8, up to 256.
inline bool supports_head_dim(int64_t hd) { return hd % 8 == 0 && hd <= 256; }

// q, out [B, T, nq, hd], k, v [B, T, nkv, hd], lse [B, nq, T] fp32 on the device; causal, scale 1/√hd.
void forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
             int64_t nq, int64_t nkv, int64_t hd);
// dq, dk, dv written from dout and the forward's out and lse. Deterministic (cuDNN's deterministic
// backward algorithm: no atomics in its dQ).
void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
              const float* out, const float* lse, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd);

// fp32 ↔ bf16 over n elements on `stream` (a cudaStream_t), rounding to nearest even (attention.cu).
void to_bf16(void* dst, const float* src, int64_t n, void* stream);
void to_f32(float* dst, const void* src, int64_t n, void* stream);

}  // namespace zaya::ops::cuda::cudnn_sdpa
