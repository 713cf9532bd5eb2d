// One test, two devices: RoPE on CUDA against RoPE on the CPU (the reference, tested against
// float64 in test_rope.cc) from the same inputs. Skipped with a message where no GPU is present
// (docs/cuda.md: scripts/gpu_check.sh runs them on one).
//
// Tolerance: bitwise. Both devices do math::rope_rotate's float operations in the same order (two
// products rounded on their own, then one addition; sequence_math.h pins the rounding against
// nvcc's FMA contraction), on the same tables; test_sequence_math.cc checks the host side of that
// function against the CPU op bit for bit.
#include <gtest/gtest.h>

#include <tuple>

#include "ops/cuda_compare.h"
#include "zaya/ops/rope.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::on_gpu;

TEST(RopeCuda, ForwardBackwardAndInPlaceAreBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  // Odd sizes; a partial rotation (factor 0.5: 10 of 20 dims) and a full one; a decode offset.
  for (auto [B, T, H, hd, factor, offset] : {std::tuple<int64_t, int64_t, int64_t, int64_t, double, int64_t>{
                                                 2, 37, 3, 20, 0.5, 5},
                                             {1, 130, 8, 128, 0.5, 0},
                                             {3, 1, 2, 16, 1.0, 41}}) {
    const RopeTable t = make_rope_table(hd, factor, 1e4, T + offset + 2);
    RopeTable tg = t;
    tg.cos = on_gpu(t.cos);
    tg.sin = on_gpu(t.sin);
    Tensor x = test::random_tensor({B, T, H, hd}, 1, 2.0f), y = x.clone();
    rope_forward(y, x, t, B, T, H, hd, offset);
    Tensor xg = on_gpu(x), yg = test::gpu_empty(x.shape());
    rope_forward(yg, xg, tg, B, T, H, hd, offset);
    EXPECT_TRUE(bitwise_equal(yg, y)) << "forward, hd " << hd;

    Tensor dx = x.clone();
    rope_backward(dx, y, t, B, T, H, hd, offset);
    Tensor dxg = test::gpu_empty(x.shape());
    rope_backward(dxg, yg, tg, B, T, H, hd, offset);
    EXPECT_TRUE(bitwise_equal(dxg, dx)) << "backward, hd " << hd;

    Tensor inplace = xg.clone();  // y = x, as the model calls it
    rope_forward(inplace, inplace, tg, B, T, H, hd, offset);
    EXPECT_TRUE(bitwise_equal(inplace, y)) << "in place, hd " << hd;
  }
}

}  // namespace
}  // namespace zaya::ops
