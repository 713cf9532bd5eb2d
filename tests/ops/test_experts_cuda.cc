// One test, two devices: ops::experts_forward / experts_backward on CUDA (a cuBLASLt GEMM per
// expert) against the CPU op (itself tested against float64 and finite differences in
// test_experts.cc), from the same routed tokens, f32 and bf16 weights. Every forward output and
// every gradient is compared. Skipped with a message where no GPU is present.
//
// Tolerances, norm-wise relative:
// - f32: the results chain GEMMs with SwiGLU between (a few ulp, test_dense_cuda.cc's kFewTerms);
//   the longest chain is dy → dact (K = H) → dgu → dxp (K = 2I), and the weight gradients sum over
//   an expert's rows (K < 100). Errors along a chain add, so the GEMM bound of cuda_compare.h at the
//   chain's total depth K = H + 2I, doubled for the SwiGLU steps and the accumulation: 2·4·(K + 2)·u.
// - bf16: the same, plus the bf16 roundings of the GEMMs' inputs (act16, dgu16) taken from f32
//   values that differ between the devices in their last bits: a rounding that falls the other way
//   moves an element by one bf16 step (2⁻⁸ relative), for a fraction ~(f32 difference)/2⁻⁸ ≈ 1e-4
//   of the elements, √(1e-4)·2⁻⁸ ≈ 4e-5 norm-wise; 1e-3 leaves room for a chain of two.
// - exact: the gather (xp) and the bf16 copy of xp.
#include <gtest/gtest.h>

#include <vector>

#include "ops/cuda_compare.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/moe.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr int64_t N = 200, H = 96, I = 80, E = 5;
constexpr double kBf16Chain = 1e-3;

struct Routed {
  Tensor x, offsets, src;
  int64_t M = 0;
};

// Tokens over the experts and the skip class, expert 2 left without any (a GEMM of no rows).
Routed route(uint64_t seed) {
  Routed r;
  r.x = random_tensor({N, H}, seed);
  Tensor choice = Tensor::empty({N}, DType::i32), counts = Tensor::empty({E}, DType::i32);
  for (int64_t n = 0; n < N; ++n) {
    int32_t c = static_cast<int32_t>((n * 7 + n / 3) % (E + 1));
    choice.data<int32_t>()[n] = c == 2 ? 3 : c;
  }
  r.offsets = Tensor::empty({E + 1}, DType::i32);
  r.src = Tensor::empty({N}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32);
  r.M = moe_plan(counts, r.offsets, pos, r.src, choice, N, E);
  return r;
}

struct Side {
  ExpertActs a;
  ExpertScratch s;
  ExpertWeights g;
  Tensor dxp;
};

Side buffers(Device d, bool b16) {
  auto z = [d](const Shape& s, DType t = DType::f32) { return Tensor::zeros(s, t, d); };
  Side b;
  b.a = {z({N, H}), z({N, 2 * I}), z({N, I}), z({N, H}), b16 ? z({N, H}, DType::bf16) : Tensor{},
         b16 ? z({N, I}, DType::bf16) : Tensor{}};
  b.s = {z({N, I}), z({N, 2 * I}), b16 ? z({N, H}, DType::bf16) : Tensor{}, b16 ? z({N, 2 * I}, DType::bf16) : Tensor{}};
  b.dxp = z({N, H});
  return b;
}

TEST(ExpertsCuda, ForwardAndBackwardMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const Routed r = route(1);
  ASSERT_GT(r.M, 0);
  ASSERT_EQ(r.offsets.data<int32_t>()[2], r.offsets.data<int32_t>()[3]);  // expert 2 has no tokens
  for (bool b16 : {false, true}) {
    const DType wt = b16 ? DType::bf16 : DType::f32;
    const ExpertWeights w{random_tensor({E, 2 * I, H}, 2, 0.2f, wt), random_tensor({E, H, I}, 3, 0.2f, wt)};
    const ExpertWeights wg{on_gpu(w.gate_up), on_gpu(w.down)};
    Tensor dy = random_tensor({N, H}, 4);
    // Weight gradients accumulate: both start from the same non-zero values.
    const Tensor g_gu0 = random_tensor({E, 2 * I, H}, 5), g_d0 = random_tensor({E, H, I}, 6);

    Side c = buffers(Device::cpu, b16), g = buffers(Device::cuda, b16);
    c.g = {g_gu0.clone(), g_d0.clone()};
    g.g = {on_gpu(g_gu0), on_gpu(g_d0)};
    experts_forward(c.a, r.x, r.src, r.offsets, w, r.M);
    experts_forward(g.a, on_gpu(r.x), on_gpu(r.src), on_gpu(r.offsets), wg, r.M);
    const char* what = b16 ? "bf16" : "f32";
    const double tol = b16 ? kBf16Chain : 2 * test::gemm_tolerance(H + 2 * I);
    auto rows = [&](const Tensor& t) { return t.slice(0, r.M); };
    EXPECT_TRUE(bitwise_equal(rows(g.a.xp), rows(c.a.xp))) << what;
    if (b16) {
      EXPECT_TRUE(bitwise_equal(rows(g.a.xp16), rows(c.a.xp16)));
    }
    EXPECT_LT(rel_diff(rows(g.a.gu), rows(c.a.gu)), tol) << what;
    EXPECT_LT(rel_diff(rows(g.a.act), rows(c.a.act)), tol) << what;
    EXPECT_LT(rel_diff(rows(g.a.y), rows(c.a.y)), tol) << what;

    const bool ran_c = experts_backward(c.dxp, c.g, dy, r.offsets, w, c.a, c.s, r.M, {});
    const bool ran_g = experts_backward(g.dxp, g.g, on_gpu(dy), on_gpu(r.offsets), wg, g.a, g.s, r.M, {});
    EXPECT_FALSE(ran_g);  // no side tasks given; the CUDA op never runs them
    (void)ran_c;
    EXPECT_LT(rel_diff(rows(g.dxp), rows(c.dxp)), tol) << what;
    EXPECT_LT(rel_diff(g.g.gate_up, c.g.gate_up), tol) << what;
    EXPECT_LT(rel_diff(g.g.down, c.g.down), tol) << what;
    // The empty expert's gradients are untouched.
    EXPECT_TRUE(bitwise_equal(g.g.down.select(2), g_d0.select(2))) << what;
  }
}

TEST(ExpertsCuda, NoRoutedRowsTouchNothing) {
  ZAYA_SKIP_WITHOUT_GPU();
  const Routed r = route(7);
  const ExpertWeights wg{on_gpu(random_tensor({E, 2 * I, H}, 8)), on_gpu(random_tensor({E, H, I}, 9))};
  Side g = buffers(Device::cuda, false);
  const Tensor y0 = g.a.y.clone();
  experts_forward(g.a, on_gpu(r.x), on_gpu(r.src), on_gpu(r.offsets), wg, 0);
  EXPECT_TRUE(bitwise_equal(g.a.y, y0));
}

}  // namespace
}  // namespace zaya::ops
