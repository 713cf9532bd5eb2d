// CPU kernels behind zaya/ops/experts.h (arguments already checked there), and the CPU's switch
// between its two ways of running the experts.
#pragma once

#include <cstdint>
#include <span>

#include "zaya/ops/experts.h"

namespace zaya::ops::cpu {

void experts_forward(const ExpertActs& a, const Tensor& x, const Tensor& src, const Tensor& offsets,
                     const ExpertWeights& w, int64_t M);
bool experts_backward(const Tensor& dxp, const ExpertWeights& grads, const Tensor& dy, const Tensor& offsets,
                      const ExpertWeights& w, const ExpertActs& a, const ExpertScratch& scratch,
                      int64_t M, std::span<SideTask> side);

// The experts' two ways (experts_cpu.cc): fused, one task per expert or row piece (default; taken
// in f32 for small expert weights when the threads stay even), or grouped, one pass per step over
// every expert. Both give the same bits; the switch (process-wide) is for tests and A/B
// benchmarks.
void set_fused_experts(bool on);
bool fused_experts();

}  // namespace zaya::ops::cpu
