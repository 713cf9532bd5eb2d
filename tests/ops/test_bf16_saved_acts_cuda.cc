// The CUDA kernels' bf16 saved-activation inputs (the SwiGLU backward's gu, the combine backward's
// y, the experts op's gu16/y16) against the CPU op on the same inputs, and against the CUDA f32
// kernel on the widened inputs. Skipped with a message where no GPU is present; the suite names
// (DenseCuda, MoeCuda, ExpertsCuda) are those scripts/gpu_check.sh runs.
//
// Tolerances:
// - CUDA bf16 input vs CUDA f32 kernel on the widened input: exact (the kernels widen as they read
//   and then do the f32 kernel's arithmetic, in the same order).
// - vs the CPU: the f32 ops' own tolerances (test_dense_cuda.cc's kFewTerms = 1e-5 for SwiGLU: the
//   devices' exp differs by a few ulp; test_moe_cuda.cc's 1e-5 of Σ|dout·y| per dweight: a sum in
//   another order; exact for the combine's dy, a product), since the bf16 values are the same bits on
//   both devices. For the experts op, test_experts_cuda.cc's bf16 bound kBf16Chain = 1e-3: gu and y
//   differ between the devices in their last f32 bits, so their bf16 roundings (gu16, y16) may fall
//   on different sides for a ~1e-4 fraction of the elements, one bf16 step each (√1e-4·2⁻⁸ ≈ 4e-5
//   norm-wise), and the backward then chains GEMMs on them.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/cuda_compare.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/moe.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::gpu_empty;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

Tensor bf16_of(const Tensor& f) {
  Tensor b = Tensor::empty(f.shape(), DType::bf16, f.device());
  cast_to_bf16(b, f);
  return b;
}

Tensor widened(const Tensor& b) {
  Tensor f = Tensor::empty(b.shape(), DType::f32, b.device());
  cast_to_f32(f, b);
  return f;
}

TEST(DenseCuda, SwigluBackwardOnBf16GuMatchesTheCpuAndTheWidenedF32Kernel) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t n = 300, inter = 129;
  const Tensor gu16 = bf16_of(random_tensor({n, 2 * inter}, 3, 3.0f)), dy = random_tensor({n, inter}, 4);
  const Tensor gu16_g = on_gpu(gu16), dy_g = on_gpu(dy);
  Tensor d_cpu = Tensor::empty({n, 2 * inter}, DType::f32), d16 = gpu_empty({n, 2 * inter}),
         d32 = gpu_empty({n, 2 * inter});
  swiglu_backward(d_cpu, dy, gu16);
  swiglu_backward(d16, dy_g, gu16_g);
  swiglu_backward(d32, dy_g, widened(gu16_g));
  EXPECT_TRUE(bitwise_equal(d16, d32));
  EXPECT_LT(rel_diff(d16, d_cpu), 1e-5);
}

// H 333 (the scalar path) and 256 (four elements at a time).
TEST(MoeCuda, CombineBackwardOnBf16YMatchesTheCpuAndTheWidenedF32Kernel) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t N = 300, E = 6;
  Tensor choice = Tensor::empty({N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>((n * 5 + n / 7) % (E + 2) % (E + 1));
  Tensor counts = Tensor::empty({E}, DType::i32), offsets = Tensor::empty({E + 1}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32), src = Tensor::empty({N}, DType::i32);
  const int64_t M = moe_plan(counts, offsets, pos, src, choice, N, E);
  const Tensor weight = random_tensor({N}, 5), weight_g = on_gpu(weight), pos_g = on_gpu(pos);
  for (int64_t H : {int64_t{333}, int64_t{256}}) {
    SCOPED_TRACE(H);
    const Tensor y16 = bf16_of(random_tensor({N, H}, 6)), dout = random_tensor({N, H}, 7);
    const Tensor y16_g = on_gpu(y16), dout_g = on_gpu(dout);
    Tensor dy = Tensor::zeros({N, H}, DType::f32), dw = Tensor::empty({N}, DType::f32);
    Tensor dy16 = on_gpu(Tensor::zeros({N, H}, DType::f32)), dw16 = gpu_empty({N});
    Tensor dy32 = on_gpu(Tensor::zeros({N, H}, DType::f32)), dw32 = gpu_empty({N});
    moe_unpermute_backward(dy, dw, dout, y16, weight, pos, M, N, H);
    moe_unpermute_backward(dy16, dw16, dout_g, y16_g, weight_g, pos_g, M, N, H);
    moe_unpermute_backward(dy32, dw32, dout_g, widened(y16_g), weight_g, pos_g, M, N, H);
    EXPECT_TRUE(bitwise_equal(dy16, dy32));
    EXPECT_TRUE(bitwise_equal(dw16, dw32));
    EXPECT_TRUE(bitwise_equal(dy16, dy));
    const Tensor dw_host = dw16.to(Device::cpu), y = widened(y16);
    const int32_t* ps = pos.data<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      if (ps[n] < 0) {
        EXPECT_EQ(dw_host.data<float>()[n], 0.0f) << n;
        continue;
      }
      double scale = 0;
      for (int64_t h = 0; h < H; ++h)
        scale += std::fabs(double(dout.data<float>()[n * H + h]) * y.data<float>()[ps[n] * H + h]);
      EXPECT_LE(std::fabs(dw_host.data<float>()[n] - dw.data<float>()[n]), 1e-5 * scale) << n;
    }
  }
}

TEST(ExpertsCuda, Bf16SavedActivationsMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  constexpr int64_t N = 200, H = 96, I = 80, E = 5;
  Tensor x = random_tensor({N, H}, 1), choice = Tensor::empty({N}, DType::i32), counts = Tensor::empty({E}, DType::i32);
  for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>((n * 7 + n / 3) % (E + 1));
  Tensor offsets = Tensor::empty({E + 1}, DType::i32), src = Tensor::empty({N}, DType::i32),
         pos = Tensor::empty({N}, DType::i32);
  const int64_t M = moe_plan(counts, offsets, pos, src, choice, N, E);
  ASSERT_GT(M, 0);
  const ExpertWeights w{random_tensor({E, 2 * I, H}, 2, 0.2f, DType::bf16), random_tensor({E, H, I}, 3, 0.2f, DType::bf16)};
  const Tensor dy = random_tensor({N, H}, 4), g_gu0 = random_tensor({E, 2 * I, H}, 5), g_d0 = random_tensor({E, H, I}, 6);
  struct Run {
    ExpertActs a;
    ExpertScratch s;
    ExpertWeights g;
    Tensor dxp;
  };
  auto run = [&](Device d) {
    auto z = [d](const Shape& s, DType t = DType::f32) { return Tensor::zeros(s, t, d); };
    Run r;
    r.a = {z({N, H}), z({N, 2 * I}), z({N, I}), z({N, H}), z({N, H}, DType::bf16), z({N, I}, DType::bf16),
           z({N, 2 * I}, DType::bf16), z({N, H}, DType::bf16)};
    r.s = {z({N, I}), z({N, 2 * I}), z({N, H}, DType::bf16), z({N, 2 * I}, DType::bf16)};
    r.g = {g_gu0.to(d), g_d0.to(d)};
    r.dxp = z({N, H});
    const ExpertWeights wd{w.gate_up.to(d), w.down.to(d)};
    experts_forward(r.a, x.to(d), src.to(d), offsets.to(d), wd, M);
    Tensor nan = Tensor::empty({N, 2 * I}, DType::f32);
    nan.fill_(std::nan(""));
    r.a.gu.copy_from(nan);  // the backward reads gu16, never gu
    experts_backward(r.dxp, r.g, dy.to(d), offsets.to(d), wd, r.a, r.s, M, {});
    return r;
  };
  const Run c = run(Device::cpu), g = run(Device::cuda);
  auto rows = [&](const Tensor& t) { return t.slice(0, M); };
  EXPECT_LT(rel_diff(widened(rows(g.a.gu16)), widened(rows(c.a.gu16))), 1e-3);
  EXPECT_LT(rel_diff(widened(rows(g.a.y16)), widened(rows(c.a.y16))), 1e-3);
  EXPECT_TRUE(bitwise_equal(rows(g.a.y16), bf16_of(rows(g.a.y))));
  EXPECT_LT(rel_diff(rows(g.dxp), rows(c.dxp)), 1e-3);
  EXPECT_LT(rel_diff(g.g.gate_up, c.g.gate_up), 1e-3);
  EXPECT_LT(rel_diff(g.g.down, c.g.down), 1e-3);
}

}  // namespace
}  // namespace zaya::ops
