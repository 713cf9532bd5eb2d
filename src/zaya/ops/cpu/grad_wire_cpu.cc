// Streaming element loops; each element's result depends on that element only, so the thread
// split changes no bit.
#include "zaya/ops/cpu/grad_wire_cpu.h"

namespace zaya::ops::cpu {

void accumulate_wide(const Tensor& wide, const Tensor& g) {
  double* w = wide.data<double>();
  float* p = g.data<float>();
  const int64_t n = g.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    w[i] += static_cast<double>(p[i]);
    p[i] = 0.0f;
  }
}

void narrow_scaled(const Tensor& g, const Tensor& wide, double scale) {
  double* w = wide.data<double>();
  float* p = g.data<float>();
  const int64_t n = g.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(w[i] * scale);
    w[i] = 0.0;
  }
}

void to_bf16_wire(const Tensor& dst, const Tensor& src) {
  bf16* d = dst.data<bf16>();
  const float* s = src.data<float>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = to_bf16(s[i]);
}

void from_bf16_wire(const Tensor& dst, const Tensor& src, float scale) {
  float* d = dst.data<float>();
  const bf16* s = src.data<bf16>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = to_float(s[i]) * scale;
}

}  // namespace zaya::ops::cpu
