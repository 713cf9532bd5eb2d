// One test, two devices: the skip-class passthrough (ops/moe_skip.h) on CUDA against the same ops
// on the CPU (the reference, itself checked against float64 in test_moe_skip.cc), from the same
// inputs. Skipped with a message where no GPU is present (docs/cuda.md: scripts/gpu_check.sh runs
// it on one).
//
// What must agree, and how closely (fp32 on both devices):
// - exactly: the forward p_skip·x and the input gradient dx + p_skip·dout (one product, one sum:
//   ops/moe_skip_math.h rounds them the same way on both), and every routed row left untouched;
// - the router's gradient s·p_E·(δ_Ee − p_e), s = ⟨dout, x⟩: a sum of H = 333 products in another
//   order (a warp butterfly against the CPU's h order); per row within 4·H·u of
//   Σ_h |dout·x| · p_E · (1 + p_e), the worst case of two fp32 sums' rounding (u = 2^-24).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/cuda_compare.h"
#include "test_util.h"
#include "zaya/ops/moe_skip.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::on_gpu;
using test::random_tensor;

// 2500 tokens, 16 experts as ZAYA1, an odd H; every 3rd token skipped.
constexpr int64_t N = 2500, E = 16, K = E + 1, H = 333;

struct Inputs {
  Tensor x = random_tensor({N, H}, 51), dout = random_tensor({N, H}, 52), probs = random_tensor({N, K}, 53, 0.3f);
  Tensor choice = Tensor::empty({N}, DType::i32);
  Inputs() {
    for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>(n % 3 == 0 ? E : n % E);
  }
};

TEST(MoeSkipCuda, ForwardAndInputGradientMatchTheCpuBitwise) {
  ZAYA_SKIP_WITHOUT_GPU();
  Inputs in;
  Tensor out = random_tensor({N, H}, 54), dx = random_tensor({N, H}, 55);
  Tensor out_gpu = on_gpu(out), dx_gpu = on_gpu(dx);
  moe_skip_forward(out, in.x, in.probs, in.choice, N, E, H);
  moe_skip_forward(out_gpu, on_gpu(in.x), on_gpu(in.probs), on_gpu(in.choice), N, E, H);
  EXPECT_TRUE(bitwise_equal(out_gpu, out));
  moe_skip_input_backward(dx, in.dout, in.probs, in.choice, N, E, H);
  moe_skip_input_backward(dx_gpu, on_gpu(in.dout), on_gpu(in.probs), on_gpu(in.choice), N, E, H);
  EXPECT_TRUE(bitwise_equal(dx_gpu, dx));
}

TEST(MoeSkipCuda, RouterGradientMatchesTheCpuWithinTheDotProductsRounding) {
  ZAYA_SKIP_WITHOUT_GPU();
  Inputs in;
  Tensor dl = random_tensor({N, K}, 56), dl_gpu = on_gpu(dl);
  const Tensor before = dl.clone();
  moe_skip_router_backward(dl, in.dout, in.x, in.probs, in.choice, N, E, H);
  moe_skip_router_backward(dl_gpu, on_gpu(in.dout), on_gpu(in.x), on_gpu(in.probs), on_gpu(in.choice), N, E, H);
  const Tensor got = dl_gpu.to(Device::cpu);
  const float *x = in.x.data<float>(), *g = in.dout.data<float>(), *p = in.probs.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    double abs_sum = 0;
    for (int64_t h = 0; h < H; ++h) abs_sum += std::fabs(double(g[n * H + h]) * x[n * H + h]);
    for (int64_t e = 0; e < K; ++e) {
      const int64_t i = n * K + e;
      if (in.choice.data<int32_t>()[n] != E) {
        ASSERT_EQ(got.data<float>()[i], before.data<float>()[i]) << "routed row " << n << " was written";
        continue;
      }
      const double tol = 4.0 * H * test::kUnitRoundoff * abs_sum * p[n * K + E] * (1.0 + std::fabs(p[i]));
      ASSERT_NEAR(got.data<float>()[i], dl.data<float>()[i], tol) << n << "," << e;
    }
  }
}

}  // namespace
}  // namespace zaya::ops
