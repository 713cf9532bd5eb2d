// Non-finite values in weights: a NaN or infinity in a parameter makes every gradient non-finite,
// so every update is skipped and the run goes nowhere. They are refused where weights enter a
// model (an import, a checkpoint load), naming the tensor.
#pragma once

#include <cstdint>
#include <string>

#include "zaya/core/tensor.h"

namespace zaya::ckpt {

struct NonFiniteCount {
  int64_t count = 0;   // NaN and infinite elements
  int64_t first = -1;  // flat index of the first one (-1: none)
  float value = 0;     // its value
};

// Counts the non-finite elements of an f32 or bf16 CPU tensor (other dtypes hold none).
NonFiniteCount count_non_finite(const Tensor& t);

// Throws zaya::Error naming tensor `name`, `where` (its file) and the first bad element when `t`
// holds a non-finite value.
void require_finite(const Tensor& t, const std::string& name, const std::string& where);

}  // namespace zaya::ckpt
