#include "zaya/core/random.h"

#include "zaya/core/philox.h"

namespace zaya {
namespace {

template <class Draw>
void fill_host(Tensor& t, Draw draw) {
  int64_t n = t.numel();
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = draw(i);
  } else {
    check_dtype("random fill target", t, DType::bf16);
    bf16* p = t.data<bf16>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = to_bf16(draw(i));
  }
}

void fill(Tensor& t, uint64_t seed, uint64_t offset, bool normal, float a, float b) {
  if (t.device() == Device::cuda) {
#ifdef ZAYA_HAVE_CUDA
    check_dtype("CUDA random fill target", t, DType::f32);
    cuda::philox_fill_f32(t.data<float>(), t.numel(), seed, offset, normal, a, b);
    return;
#endif
  }
  if (normal)
    fill_host(t, [&](int64_t i) { return a + b * philox_normal(seed, offset + static_cast<uint64_t>(i)); });
  else
    fill_host(t, [&](int64_t i) { return a + (b - a) * philox_uniform(seed, offset + static_cast<uint64_t>(i)); });
}

}  // namespace

void fill_uniform(Tensor& t, uint64_t seed, uint64_t offset, float lo, float hi) {
  fill(t, seed, offset, false, lo, hi);
}
void fill_normal(Tensor& t, uint64_t seed, uint64_t offset, float mean, float std) {
  fill(t, seed, offset, true, mean, std);
}

}  // namespace zaya
