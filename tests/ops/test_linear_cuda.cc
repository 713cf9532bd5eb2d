// One test, two devices: linear_forward and linear_backward on CUDA against the same ops on the
// CPU (the reference, itself tested against float64 in test_dense.cc), f32 and bf16 x and W, from
// the same random inputs. Skipped with a message where no GPU is present, and where ops::gemm has
// no CUDA kernel yet (the products are ops::gemm's; docs/cuda.md).
//
// Tolerances (norm-wise relative):
// - y and dx, 1e-5: sums of 333 (y) or 129 (dx) products in another order (the CPU's and the
//   device's GEMM blockings), fp32 accumulation on both; with bf16 x and W the products are exact in
//   fp32, so the same bound. This assumes fp32 GEMMs (no TF32) on the device.
// - dW and db, 1e-4: sums over the 300 rows of random-sign terms, accumulated onto a non-zero start
//   and compared as the change; cancellation amplifies their relative error (kColumnSums in
//   test_dense_cuda.cc).
// - dy_bf16: bitwise, the same rounding function on both devices.
#include <gtest/gtest.h>

#include <vector>

#include "ops/cuda_compare.h"
#include "zaya/ops/dense.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::gpu_empty;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr int64_t kRows = 300, kIn = 333, kOut = 129;

// The change `after − before` of an accumulated gradient, in float64.
std::vector<double> change(const Tensor& after, const Tensor& before) {
  std::vector<double> a = test::to_f64(after.to(Device::cpu)), b = test::to_f64(before);
  for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

TEST(LinearCuda, ForwardAndBackwardMatchTheCpuInF32AndBf16) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_GEMM();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dt == DType::f32 ? "f32" : "bf16");
    Tensor x = random_tensor({kRows, kIn}, 71, 1.0f, dt), W = random_tensor({kOut, kIn}, 72, 0.1f, dt);
    Tensor b = random_tensor({kOut}, 73), dy = random_tensor({kRows, kOut}, 74);
    Tensor xg = on_gpu(x), Wg = on_gpu(W), bg = on_gpu(b), dyg = on_gpu(dy);
    Tensor y = Tensor::empty({kRows, kOut}, DType::f32), yg = gpu_empty({kRows, kOut});
    linear_forward(y, x, W, b);
    linear_forward(yg, xg, Wg, bg);
    EXPECT_LT(rel_diff(yg, y), 1e-5);

    // dx accumulated onto a start, dW and db accumulated.
    Tensor dx0 = random_tensor({kRows, kIn}, 75), dW0 = random_tensor({kOut, kIn}, 76),
           db0 = random_tensor({kOut}, 77);
    Tensor dx = dx0.clone(), dW = dW0.clone(), db = db0.clone();
    Tensor dxg = on_gpu(dx0), dWg = on_gpu(dW0), dbg = on_gpu(db0);
    const bool bf = dt == DType::bf16;
    Tensor d16 = bf ? Tensor::empty({kRows, kOut}, DType::bf16) : Tensor{};
    Tensor d16g = bf ? gpu_empty({kRows, kOut}, DType::bf16) : Tensor{};
    linear_backward(dx, dW, db, dy, x, W, d16, /*accumulate_dx=*/true);
    linear_backward(dxg, dWg, dbg, dyg, xg, Wg, d16g, true);
    EXPECT_LT(rel_diff(dxg, dx), 1e-5);
    EXPECT_LT(test::rel_error(change(dWg, dW0), change(dW, dW0)), 1e-4);
    EXPECT_LT(test::rel_error(change(dbg, db0), change(db, db0)), 1e-4);
    if (bf) {
      EXPECT_TRUE(bitwise_equal(d16g, d16));
    }

    // dx written (not accumulated), no parameter gradients.
    Tensor dxw = Tensor::empty({kRows, kIn}, DType::f32), dxwg = gpu_empty({kRows, kIn});
    linear_backward(dxw, Tensor{}, Tensor{}, dy, x, W, d16);
    linear_backward(dxwg, Tensor{}, Tensor{}, dyg, xg, Wg, d16g);
    EXPECT_LT(rel_diff(dxwg, dxw), 1e-5);
  }
}

}  // namespace
}  // namespace zaya::ops
