#include "zaya/ckpt/finite.h"

#include <cmath>

#include "zaya/core/error.h"

namespace zaya::ckpt {

NonFiniteCount count_non_finite(const Tensor& any) {
  NonFiniteCount out;
  const Tensor t = any.device() == Device::cpu ? any : any.to(Device::cpu);  // scanned on the host
  auto scan = [&](auto get) {
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      const float v = get(i);
      if (std::isfinite(v)) continue;
      if (out.count++ == 0) {
        out.first = i;
        out.value = v;
      }
    }
  };
  if (t.dtype() == DType::f32) {
    const float* p = t.data<float>();
    scan([p](int64_t i) { return p[i]; });
  } else if (t.dtype() == DType::bf16) {
    const bf16* p = t.data<bf16>();
    scan([p](int64_t i) { return to_float(p[i]); });
  }
  return out;
}

void require_finite(const Tensor& t, const std::string& name, const std::string& where) {
  const NonFiniteCount bad = count_non_finite(t);
  if (bad.count == 0) return;
  throw Error(str("tensor '", name, "' ", t.shape().str(), " holds ", bad.count, " non-finite value",
                  bad.count == 1 ? "" : "s", " (the first, element ", bad.first, ", is ", bad.value,
                  "); a model with them skips every update and produces nothing usable"),
              {.file = where, .field = name, .expected = "finite values"});
}

}  // namespace zaya::ckpt
