// The experts of one layer on a GPU (experts_cuda.h), the CPU's grouped way step for step
// (cpu/experts_cpu.cc): the gather, one cuBLASLt GEMM per expert with tokens for gate_up, SwiGLU
// over all M rows, one GEMM per expert for down; the backward likewise in reverse. The SwiGLU and
// bf16 casts go through their fronts (cuda/dense.cu).
//
// The GEMMs' row ranges come from the offsets, which live on the device: they are copied to the
// host once per call (a host synchronization: the host needs them to launch the per-expert GEMMs),
// not once per expert.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "zaya/ops/cuda/experts_cuda.h"
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cuda {
namespace {

// xp[r] = x[src[r]] for r < M; a src outside [0, N) makes its row NaN (the CPU throws; a kernel
// cannot), so the loss shows it.
__global__ void gather_rows_kernel(float* xp, const float* x, const int32_t* src, int64_t M, int64_t N, int64_t H) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < M * H;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / H, j = k % H;
    const int64_t s = src[r];
    xp[k] = (s >= 0 && s < N) ? x[s * H + j] : NAN;
  }
}

// The calling thread's host copy of the offsets and its problem list, reused from call to call.
struct Workspace {
  std::vector<int32_t> offsets;
  std::vector<GemmProblem> problems;
};
thread_local Workspace t_ws;

const int32_t* host_offsets(zaya::cuda::DeviceContext& ctx, const Tensor& offsets) {
  t_ws.offsets.resize(static_cast<size_t>(offsets.numel()));
  ctx.copy_async(t_ws.offsets.data(), Device::cpu, offsets.raw(), Device::cuda, offsets.nbytes());
  ctx.synchronize();
  return t_ws.offsets.data();
}

// One problem per expert with rows: (X rows of e, W[e], Y rows of e).
std::vector<GemmProblem>& per_expert(const int32_t* off, int64_t E, const Tensor& X, const Tensor& W,
                                     const Tensor& Y) {
  std::vector<GemmProblem>& problems = t_ws.problems;
  problems.clear();
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) problems.push_back({X.slice(off[e], off[e + 1]), W.select(e), Y.slice(off[e], off[e + 1])});
  return problems;
}

}  // namespace

void experts_forward(const ExpertActs& a, const Tensor& x, const Tensor& src, const Tensor& offsets,
                     const ExpertWeights& w, int64_t M) {
  constexpr std::string_view op = "experts_forward";
  auto& ctx = context_for(op);
  if (M == 0) return;
  const int32_t* off = host_offsets(ctx, offsets);
  const int64_t E = offsets.numel() - 1, N = x.size(0), H = x.size(1);
  const bool b16 = w.gate_up.dtype() == DType::bf16;
  gather_rows_kernel<<<blocks_for(M * H), kThreads, 0, stream_of(ctx)>>>(a.xp.data<float>(), x.data<float>(),
                                                                         src.data<int32_t>(), M, N, H);
  check_launch(op);
  if (b16) ops::cast_to_bf16(a.xp16.slice(0, M), a.xp.slice(0, M));
  ops::gemm_grouped(per_expert(off, E, b16 ? a.xp16 : a.xp, w.gate_up, a.gu), Trans::N, Trans::T);  // gu = xp·W_guᵀ
  if (a.gu16.defined()) ops::cast_to_bf16(a.gu16.slice(0, M), a.gu.slice(0, M));  // bf16 saved activations
  ops::swiglu_forward(a.act.slice(0, M), a.gu.slice(0, M));
  if (b16) ops::cast_to_bf16(a.act16.slice(0, M), a.act.slice(0, M));
  ops::gemm_grouped(per_expert(off, E, b16 ? a.act16 : a.act, w.down, a.y), Trans::N, Trans::T);  // y = act·W_dᵀ
  if (a.y16.defined()) ops::cast_to_bf16(a.y16.slice(0, M), a.y.slice(0, M));
}

bool experts_backward(const Tensor& dxp, const ExpertWeights& grads, const Tensor& dy_f32, const Tensor& offsets,
                      const ExpertWeights& w, const ExpertActs& a, const ExpertScratch& s, int64_t M) {
  constexpr std::string_view op = "experts_backward";
  auto& ctx = context_for(op);
  if (M == 0) return false;
  const int32_t* off = host_offsets(ctx, offsets);
  const int64_t E = offsets.numel() - 1;
  const bool b16 = w.gate_up.dtype() == DType::bf16;
  if (b16) ops::cast_to_bf16(s.dy16.slice(0, M), dy_f32.slice(0, M));
  const Tensor& dy = b16 ? s.dy16 : dy_f32;
  const Tensor& act = b16 ? a.act16 : a.act;
  const Tensor& xp = b16 ? a.xp16 : a.xp;
  // Backward of every expert's linear Y_e = X_e·W[e]ᵀ: dX_e = dY_e·W[e] (written),
  // dW[e] += dY_eᵀ·X_e.
  auto expert_linear_backward = [&](const Tensor& dY, const Tensor& W, const Tensor& X, const Tensor& dX,
                                    const Tensor& dW) {
    ops::gemm_grouped(per_expert(off, E, dY, W, dX), Trans::N, Trans::N);
    std::vector<GemmProblem>& problems = t_ws.problems;
    problems.clear();
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        problems.push_back({dY.slice(off[e], off[e + 1]), X.slice(off[e], off[e + 1]), dW.select(e)});
    ops::gemm_grouped(problems, Trans::T, Trans::N, 1.0f, 1.0f);
  };
  expert_linear_backward(dy, w.down, act, s.dact, grads.down);  // y = act·W_dᵀ
  // act = SiLU(g) ⊙ v, from the saved bf16 copy of gu where there is one
  ops::swiglu_backward(s.dgu.slice(0, M), s.dact.slice(0, M), (a.gu16.defined() ? a.gu16 : a.gu).slice(0, M));
  if (b16) ops::cast_to_bf16(s.dgu16.slice(0, M), s.dgu.slice(0, M));
  expert_linear_backward(b16 ? s.dgu16 : s.dgu, w.gate_up, xp, dxp, grads.gate_up);  // gu = xp·W_guᵀ
  return false;  // the side tasks are the caller's: they run on the same stream after these
}

}  // namespace zaya::ops::cuda
