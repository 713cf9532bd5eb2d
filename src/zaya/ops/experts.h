// One layer's experts, forward and backward (DESIGN.md, "Experts"), on the routed rows in expert
// order (ops/moe.h's moe_plan: expert e owns rows [offsets[e], offsets[e+1]) of the M routed rows):
//   xp = w[src] (the gather);  gu_e = xp_e · W_gu[e]ᵀ (gate rows first);  act = SiLU(g) ⊙ v;
//   y_e = act_e · W_d[e]ᵀ.
// How the work is spread over a device (threads, pieces, streams) is the backend's business; the
// results are the same bits whichever way a backend runs them.
#pragma once

#include <cstdint>
#include <span>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// One layer's expert weights: gate_up [E, 2I, H], down [E, H, I]. f32, or bf16 copies of both for
// bf16 GEMM inputs (f32 accumulation and outputs); gradients are always f32.
struct ExpertWeights {
  Tensor gate_up;
  Tensor down;
};

// What the forward writes and the backward reads, each with at least M rows (the caller sizes them
// for N): xp [., H] the gathered rows, gu [., 2I], act [., I], y [., H]. With bf16 weights, xp16
// [., H] and act16 [., I] receive the bf16 copies of the GEMM inputs; otherwise leave them undefined.
// With bf16 weights the backward reads xp16 and act16, never xp and act: those are the forward's
// staging for the copies, and a caller may pass the same xp and act to every layer.
// bf16 saved activations (optional, any weights): gu16 [., 2I] and y16 [., H] receive bf16 copies of
// gu and y as the forward makes them; the forward still computes from the f32 values (the SwiGLU
// reads gu, the caller's combine y). With gu16 defined the backward's SwiGLU reads gu16 (widened
// exactly) and never gu, so gu too may be one buffer for every layer; the backward reads neither y
// nor y16 (y16 is the combine's: moe_unpermute_backward takes it).
struct ExpertActs {
  Tensor xp, gu, act, y;
  Tensor xp16, act16;
  Tensor gu16, y16;
};

// The backward's temporaries: dact [., I], dgu [., 2I]; with bf16 weights also dy16 [., H] and
// dgu16 [., 2I].
struct ExpertScratch {
  Tensor dact, dgu;
  Tensor dy16, dgu16;
};

// Work that does not depend on the experts' backward and that a backend may run beside it (the
// CPU gives it to the threads that finish their experts first). `cost` (any unit, the same for all
// tasks of a call) orders the tasks, largest first.
struct SideTask {
  void (*run)(void* context, int64_t arg) = nullptr;
  void* context = nullptr;
  int64_t arg = 0;
  double cost = 0;
};

// x [N, H] the experts' input (post-attention norm output), src [N] i32 and offsets [E+1] i32 from
// moe_plan, M the routed rows. Writes a.xp (rows < M), a.gu, a.act, a.y (and the bf16 copies that
// are defined).
void experts_forward(const ExpertActs& a, const Tensor& x, const Tensor& src, const Tensor& offsets,
                     const ExpertWeights& w, int64_t M);

// From dy (dL/dy, [., H], permuted rows): writes dxp [., H] (dL/dxp, rows < M) and accumulates the
// weight gradients into grads (f32 [E, 2I, H], [E, H, I]). `side` tasks may run during the call, in
// which case it returns true; when it returns false none of them ran and the caller runs them.
bool experts_backward(const Tensor& dxp, const ExpertWeights& grads, const Tensor& dy, const Tensor& offsets,
                      const ExpertWeights& w, const ExpertActs& a, const ExpertScratch& scratch,
                      int64_t M, std::span<SideTask> side);

}  // namespace zaya::ops
