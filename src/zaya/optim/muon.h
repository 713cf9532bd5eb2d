// Muon for one matrix (REFERENCES.md "Muon"; Moonlight's AdamW-RMS-matched scale, as ZAYA1 used):
//   m ← β·m + g                       (momentum, kept in f32)
//   u = g + β·m                       (Nesterov)
//   O = NewtonSchulz₅(u)              (≈ U·Vᵀ of u; quintic (3.4445, −4.7750, 2.0315), transposed if r > c)
//   p ← p − lr·(wd·p + 0.2·√max(r, c)·O)
// The 0.2·√max(r, c) factor gives O (whose entries have RMS ≈ 1/√max(r, c)) the update RMS of
// AdamW (≈ 0.2), so AdamW's learning rate and weight decay carry over to Muon unchanged.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::optim {

struct MuonHyper {
  float lr = 0.0f;
  float momentum = 0.95f;
  float weight_decay = 0.0f;
  int ns_steps = 5;
  DType ns_dtype = DType::f32;  // Newton–Schulz GEMM inputs: f32 or bf16 (the reference's choice)
};

// The RMS-matching scale for an r×c matrix.
float muon_scale(int64_t rows, int64_t cols);

// f32 elements of scratch muon_update needs for `count` r×c matrices (an expert stack has count = E)
// with Newton–Schulz in `ns_dtype`: the orthogonalized updates plus the Newton–Schulz workspace.
int64_t muon_scratch_elems(int64_t rows, int64_t cols, int64_t count = 1, DType ns_dtype = DType::f32);

// One Muon step of a 2-D [r, c] matrix `param` with gradient `grad` and momentum `m` (same shape).
// `grad` is overwritten with the Nesterov update u (the caller zeroes gradients after the step
// anyway). `scratch` holds at least muon_scratch_elems(r, c) f32 elements.
void muon_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
                 const MuonHyper& hp);

// An [E, r, c] expert stack: E independent r×c Muon updates (never one E·r × c matrix: the experts
// are different functions and must be orthogonalized separately; one batched Newton–Schulz does
// all E). Also accepts a 2-D matrix.
void muon_update_stack(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& scratch,
                       const MuonHyper& hp);

// muon_update for one 2-D matrix with all of its work on the calling thread, for a caller that
// shares matrices out among its threads (Optimizer::step). The same math as muon_update; the bits
// can differ from it (one-thread GEMMs), never from one call of this to the next.
void muon_update_on_this_thread(const Tensor& param, const Tensor& grad, const Tensor& m,
                                const Tensor& scratch, const MuonHyper& hp);

}  // namespace zaya::optim
