// CPU kernels behind zaya/ops/grad_wire.h, with the fronts' signatures.
#pragma once

#include "zaya/ops/grad_wire.h"

namespace zaya::ops::cpu {

void accumulate_wide(const Tensor& wide, const Tensor& g);
void narrow_scaled(const Tensor& g, const Tensor& wide, double scale);
void to_bf16_wire(const Tensor& dst, const Tensor& src);
void from_bf16_wire(const Tensor& dst, const Tensor& src, float scale);

}  // namespace zaya::ops::cpu
