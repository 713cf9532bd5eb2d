// Partial rotary position embedding (rotate-half pairing), as transformers' ZAYA applies it after the
// QK norm: on the first rot = int(hd·partial_rotary_factor) dims of every head,
//   x'_j        = x_j·cos φ_j − x_{j+rot/2}·sin φ_j
//   x'_{j+rot/2} = x_{j+rot/2}·cos φ_j + x_j·sin φ_j,   φ_j = pos·inv_freq_j,  j < rot/2,
// and the remaining hd − rot dims pass through. Positions are 0..T−1 plus pos_offset (the cache
// length when decoding). Backward is the inverse rotation (−φ).
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya::ops {

// cos/sin tables [max_positions, rot/2]. The angle is computed as the reference does: inv_freq_j =
// 1 / θ^(2j/rot) in float32, then pos·inv_freq_j as a float32 product; only cos/sin of that float32
// angle are evaluated in double (correctly rounded, where torch's float cos is within an ulp).
struct RopeTable {
  Tensor cos, sin;
  int64_t rot = 0;
  int64_t max_positions() const { return cos.defined() ? cos.size(0) : 0; }
};
// Built on the host, then placed on `device` (where the rope ops that read it run).
RopeTable make_rope_table(int64_t head_dim, double partial_rotary_factor, double theta, int64_t max_positions,
                          Device device = Device::cpu);

// x, y [B, T, heads, hd] (or [B, T, heads·hd]); y may be x (in place).
void rope_forward(const Tensor& y, const Tensor& x, const RopeTable& table, int64_t B, int64_t T, int64_t heads,
                  int64_t hd, int64_t pos_offset = 0);
// dx from dy by the inverse rotation; dx may be dy (in place).
void rope_backward(const Tensor& dx, const Tensor& dy, const RopeTable& table, int64_t B, int64_t T, int64_t heads,
                   int64_t hd, int64_t pos_offset = 0);

}  // namespace zaya::ops
