// The representations data parallelism moves gradients in between ranks: the order-independent
// fp64 sum (parallel.grad_reduce = "f64") and the bf16 wire format (parallel.grad_reduce = "bf16").
// train/grad_sync.h says when each is used.
#pragma once

#include "zaya/core/tensor.h"

namespace zaya::ops {

// wide += g (f64 += f32), then g = 0. The few micro-batch terms of one step sum exactly in fp64
// unless their magnitudes differ by more than 2^29, so the sum does not depend on their order.
// wide f64 and g f32 of the same shape.
void accumulate_wide(const Tensor& wide, const Tensor& g);
// g = f32(wide · scale), rounded once; then wide = 0.
void narrow_scaled(const Tensor& g, const Tensor& wide, double scale);
// dst (bf16) = src (f32) rounded to nearest even; and back, with an f32 scale: dst = src · scale.
void to_bf16_wire(const Tensor& dst, const Tensor& src);
void from_bf16_wire(const Tensor& dst, const Tensor& src, float scale);

}  // namespace zaya::ops
