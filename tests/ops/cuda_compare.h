// What the device-parameterized op tests share (test_*_cuda.cc): the skip without a GPU, host→device copies, and the comparisons of a CUDA
// result with the CPU's (norm-wise relative error, or bitwise).
#pragma once

#include <gtest/gtest.h>

#include <cstring>

#include "ops/gradcheck.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya::test {

#define ZAYA_SKIP_WITHOUT_GPU() \
  if (::zaya::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << ::zaya::cuda::no_device_reason()

inline Tensor on_gpu(const Tensor& host) { return host.to(Device::cuda); }
inline Tensor gpu_empty(const Shape& s, DType d = DType::f32) { return Tensor::empty(s, d, Device::cuda); }

// ||cuda − cpu|| / ||cpu||, the CUDA tensor copied back first.
inline double rel_diff(const Tensor& on_cuda, const Tensor& on_cpu) {
  return rel_error(on_cuda.to(Device::cpu), to_f64(on_cpu.to(Device::cpu)));
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu), hb = b.to(Device::cpu);
  return ha.dtype() == hb.dtype() && ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// fp32's unit roundoff, 2^-24.
constexpr double kUnitRoundoff = 5.9604644775390625e-8;

// The tolerance for a GEMM's result on two devices (norm-wise relative): each element of C is a
// K-term sum, rounded in fp32 in a different order on each device (cuBLASLt's tiles and split-K
// against oneDNN's or the AMX kernel's blocks). The rounding error of such a sum is ~√K·u of
// Σ|aᵢbᵢ| per device, and for random-sign operands Σ|aᵢbᵢ| ≈ √K·|Σaᵢbᵢ|: ~K·u relative. Twice
// that for the two devices' errors, and again for the spread of a random sum around its typical
// size: 4·K·u. bf16 inputs give the same bound: their products are exact in fp32 and both devices
// accumulate in fp32.
// Two more roundings (alpha·AB + beta·C, a bias) make it 4·(K + 2)·u.
inline double gemm_tolerance(int64_t k) { return 4.0 * static_cast<double>(k + 2) * kUnitRoundoff; }

}  // namespace zaya::test
