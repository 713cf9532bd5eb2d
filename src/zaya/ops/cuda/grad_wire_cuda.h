// CUDA kernels behind zaya/ops/grad_wire.h (grad_wire.cu), with the fronts' signatures. A plain C++
// header, included only where the build has CUDA (ZAYA_HAVE_CUDA). Each element's result depends
// on that element only, through the same IEEE operations as the CPU's loops: bitwise the CPU's.
#pragma once

#include "zaya/core/tensor.h"

namespace zaya::ops::cuda {

void accumulate_wide(const Tensor& wide, const Tensor& g);
void narrow_scaled(const Tensor& g, const Tensor& wide, double scale);
void to_bf16_wire(const Tensor& dst, const Tensor& src);
void from_bf16_wire(const Tensor& dst, const Tensor& src, float scale);

}  // namespace zaya::ops::cuda
