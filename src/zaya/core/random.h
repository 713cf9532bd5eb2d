// Filling tensors from Philox streams, on whichever device the tensor lives.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"

namespace zaya {

// Element i gets lo + (hi - lo) * philox_uniform(seed, offset + i). f32 or bf16.
void fill_uniform(Tensor& t, uint64_t seed, uint64_t offset, float lo = 0.f, float hi = 1.f);
// Element i gets mean + std * philox_normal(seed, offset + i). f32 or bf16.
void fill_normal(Tensor& t, uint64_t seed, uint64_t offset, float mean = 0.f, float std = 1.f);

#ifdef ZAYA_HAVE_CUDA
namespace cuda {
// Device-side fills over a raw float buffer; `normal` picks the distribution.
void philox_fill_f32(float* out, int64_t n, uint64_t seed, uint64_t offset, bool normal, float a, float b);
}  // namespace cuda
#endif

}  // namespace zaya
