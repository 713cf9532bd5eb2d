// One test, two devices: the optimizer primitives (gradient norm, clipping, scaling, AdamW),
// Newton–Schulz and copy_block on CUDA against the CPU ops (tested against float64 in
// test_optim_ops.cc, test_newton_schulz.cc and test_copy.cc), from the same random inputs; and, on
// every machine, the shared per-element AdamW step (optim_math.h) against the CPU op.
//
// Tolerances:
// - bitwise: AdamW and the scaling (the same IEEE operations per element on both devices:
//   optim_math.h), the gradient norm (the CPU's block and lane order in double), clipping (the same
//   norm and scale), block copies, and Newton–Schulz's linear path (the same norm and one multiply).
// - Newton–Schulz in f32: each step's GEMMs differ by ~K·u (cuda_compare.h, K = the long side c);
//   the quintic multiplies a perturbation along a small singular value by up to a = 3.4445 per
//   step, so over `steps` steps a^steps·4·(K + 2)·u norm-wise.
// - Newton–Schulz in bf16: the GEMM inputs are rounded to bf16 on both devices from f32 values that
//   differ in their last bits; where a rounding falls the other way an element moves by a bf16 step
//   (2⁻⁸), for a fraction ~1e-4 of the elements, amplified like the f32 error: 1e-2 norm-wise, below
//   the bf16 iteration's own 2.5% distance from the f32 one (newton_schulz.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/cuda_compare.h"
#include "zaya/ops/copy.h"
#include "zaya/ops/grad_wire.h"
#include "zaya/ops/newton_schulz.h"
#include "zaya/ops/optim_math.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

// Sizes around the norm's 16 Ki-element blocks and its 16 lanes: empty, under one lane group, one
// block exactly, one past it, several blocks with a partial one.
std::vector<Tensor> some_grads() {
  return {random_tensor({7, 13}, 1), Tensor::zeros({0}, DType::f32), random_tensor({16384}, 2, 0.01f),
          random_tensor({16385}, 3), random_tensor({1}, 4), random_tensor({129, 257}, 5, 3.0f),
          random_tensor({100003}, 6)};
}

std::vector<Tensor> to_gpu(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(on_gpu(t));
  return out;
}

// Runs on every machine: the per-element step the CUDA kernel runs is bitwise the CPU op's, for
// the AVX-512 body and the scalar tail alike, moments near the subnormal range included.
TEST(OptimMath, AdamwStepIsBitwiseTheCpuOp) {
  const int64_t n = 1000 + 7;  // vector body and a tail
  Tensor p = random_tensor({n}, 10), m = random_tensor({n}, 11, 1e-3f), v = random_tensor({n}, 12, 1e-3f);
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  for (int64_t i = 0; i < n; i += 5) {
    mp[i] = 1e-38f;  // decays below FLT_MIN: flushed to 0
    vp[i] = 2e-38f;
  }
  v.data<float>()[1] = 0.0f;
  for (int64_t i = 0; i < n; ++i) vp[i] = std::fabs(vp[i]);
  const AdamWHyper hp{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor g = random_tensor({n}, 20 + static_cast<uint64_t>(step), 0.01f);
    if (step == 2) g.zero_();  // zero gradients: the moments decay
    std::vector<float> ps(p.data<float>(), p.data<float>() + n), ms(mp, mp + n), vs(vp, vp + n);
    const math::AdamWConsts k = math::adamw_consts(hp, step);
    for (int64_t i = 0; i < n; ++i) math::adamw_step(ps[i], g.data<float>()[i], ms[i], vs[i], k);
    adamw_update(p, m, v, g, hp, step);
    EXPECT_EQ(0, std::memcmp(ps.data(), p.data<float>(), n * sizeof(float))) << "step " << step;
    EXPECT_EQ(0, std::memcmp(ms.data(), mp, n * sizeof(float))) << "step " << step;
    EXPECT_EQ(0, std::memcmp(vs.data(), vp, n * sizeof(float))) << "step " << step;
  }
}

TEST(OptimCuda, GradNormAndClippingAreBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  std::vector<Tensor> grads = some_grads();
  std::vector<Tensor> gg = to_gpu(grads);
  const double norm = global_grad_norm(grads);
  EXPECT_EQ(global_grad_norm(gg), norm);
  EXPECT_EQ(clip_grad_norm(gg, norm / 4), clip_grad_norm(grads, norm / 4));
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bitwise_equal(gg[i], grads[i])) << i;
}

TEST(OptimCuda, ScaleAndAdamwAreBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t n = 100003;
  Tensor t = random_tensor({n}, 30), tg = on_gpu(t);
  scale_inplace(t, 0.37f);
  scale_inplace(tg, 0.37f);
  EXPECT_TRUE(bitwise_equal(tg, t));

  Tensor p = random_tensor({n}, 31), m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
  Tensor pg = on_gpu(p), mg = on_gpu(m), vg = on_gpu(v);
  const AdamWHyper hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (int64_t step = 1; step <= 4; ++step) {
    // Step 3's gradient is 0 where the first ones were tiny: moments decay toward the flush.
    Tensor g = random_tensor({n}, 40 + static_cast<uint64_t>(step), step == 3 ? 1e-30f : 0.02f);
    adamw_update(p, m, v, g, hp, step);
    adamw_update(pg, mg, vg, on_gpu(g), hp, step);
    EXPECT_TRUE(bitwise_equal(pg, p) && bitwise_equal(mg, m) && bitwise_equal(vg, v)) << "step " << step;
  }
}

// Muon's element passes and the gradient wire's conversions: the CPU's per-element operations.
TEST(OptimCuda, MuonPassesAndGradientWireAreBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t n = 70001;
  Tensor g = random_tensor({n}, 60), m = random_tensor({n}, 61, 0.1f), gg = on_gpu(g), mg = on_gpu(m);
  muon_momentum(g, m, 0.95f);
  muon_momentum(gg, mg, 0.95f);
  EXPECT_TRUE(bitwise_equal(gg, g) && bitwise_equal(mg, m)) << "muon_momentum";
  Tensor p = random_tensor({n}, 62), pg = on_gpu(p);
  muon_apply(p, g, 0.02f, 0.1f, 0.7f);
  muon_apply(pg, gg, 0.02f, 0.1f, 0.7f);
  EXPECT_TRUE(bitwise_equal(pg, p)) << "muon_apply";

  Tensor wide = Tensor::zeros({n}, DType::f64), wg = Tensor::zeros({n}, DType::f64, Device::cuda);
  Tensor a = random_tensor({n}, 63), ag = on_gpu(a);
  accumulate_wide(wide, a);
  accumulate_wide(wg, ag);
  EXPECT_TRUE(bitwise_equal(ag, a)) << "accumulate_wide zeroes g";
  narrow_scaled(a, wide, 0.25);
  narrow_scaled(ag, wg, 0.25);
  EXPECT_TRUE(bitwise_equal(ag, a)) << "narrow_scaled";
  Tensor b16 = Tensor::empty({n}, DType::bf16), b16g = Tensor::empty({n}, DType::bf16, Device::cuda);
  to_bf16_wire(b16, a);
  to_bf16_wire(b16g, ag);
  EXPECT_TRUE(bitwise_equal(b16g, b16)) << "to_bf16_wire";
  from_bf16_wire(a, b16, 0.5f);
  from_bf16_wire(ag, b16g, 0.5f);
  EXPECT_TRUE(bitwise_equal(ag, a)) << "from_bf16_wire";
}

// a^steps·4·(K + 2)·u (the file's header).
double newton_schulz_tolerance(int64_t k, int steps) {
  return std::pow(static_cast<double>(kNewtonSchulzA), steps) * test::gemm_tolerance(k);
}

TEST(NewtonSchulzCuda, OneStepMatchesTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t r = 40, c = 70;
  Tensor X = random_tensor({r, c}, 50, 0.05f);
  Tensor Xn = Tensor::empty({r, c}, DType::f32), A = Tensor::empty({r, r}, DType::f32), B = Tensor::empty({r, r}, DType::f32);
  newton_schulz_step(Xn, X, A, B);
  Tensor Xng = Tensor::empty({r, c}, DType::f32, Device::cuda), Ag = Tensor::empty({r, r}, DType::f32, Device::cuda),
         Bg = Tensor::empty({r, r}, DType::f32, Device::cuda);
  newton_schulz_step(Xng, on_gpu(X), Ag, Bg);
  EXPECT_LT(rel_diff(Ag, A), test::gemm_tolerance(c));
  EXPECT_LT(rel_diff(Xng, Xn), newton_schulz_tolerance(c, 1));
}

TEST(NewtonSchulzCuda, OrthogonalizeMatchesTheCpuWideTallBatchedAndLinear) {
  ZAYA_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t batch, rows, cols;
  };
  for (DType compute : {DType::f32, DType::bf16})
    for (const Case& k : {Case{1, 48, 80}, Case{1, 80, 48}, Case{3, 33, 65}})
      for (int steps : {5, 4}) {  // an odd and an even count (where the f32 iterate ends)
        const Shape s = k.batch == 1 ? Shape{k.rows, k.cols} : Shape{k.batch, k.rows, k.cols};
        Tensor G = random_tensor(s, 60 + static_cast<uint64_t>(k.rows));
        if (k.batch > 1) {  // the middle matrix nearly zero: the linear path beside iterated ones
          float* g1 = G.data<float>() + k.rows * k.cols;
          for (int64_t i = 0; i < k.rows * k.cols; ++i) g1[i] *= 1e-20f;
        }
        const int64_t ws = newton_schulz_workspace_elems(k.rows, k.cols, k.batch, compute);
        Tensor out = Tensor::empty(s, DType::f32), wsc = Tensor::zeros({ws}, DType::f32);
        newton_schulz_orthogonalize(out, G, wsc, steps, compute);
        Tensor outg = Tensor::empty(s, DType::f32, Device::cuda), wsg = Tensor::zeros({ws}, DType::f32, Device::cuda);
        newton_schulz_orthogonalize(outg, on_gpu(G), wsg, steps, compute);
        const double tol = compute == DType::bf16 ? 1e-2 : newton_schulz_tolerance(std::max(k.rows, k.cols), steps);
        EXPECT_LT(rel_diff(outg, out), tol)
            << dtype_name(compute) << " " << k.batch << "x" << k.rows << "x" << k.cols << " steps " << steps;
        if (k.batch > 1) {
          EXPECT_TRUE(bitwise_equal(outg.select(1), out.select(1))) << "the linear path, " << dtype_name(compute);
        }
      }
}

TEST(CopyCuda, BlocksAreBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor src = random_tensor({6, 5}, 70, 1.0f, dt), dst = random_tensor({4, 7}, 71, 1.0f, dt);
    Tensor dg = on_gpu(dst);
    copy_block(dst, 1, 2, src, 2, 1, 3, 4);  // strided rows on both sides
    copy_block(dg, 1, 2, on_gpu(src), 2, 1, 3, 4);
    EXPECT_TRUE(bitwise_equal(dg, dst)) << dtype_name(dt);
    Tensor whole = random_tensor({6, 5}, 72, 1.0f, dt), wg = on_gpu(whole);
    copy_block(whole, 0, 0, src, 1, 0, 4, 5);  // whole rows: one contiguous block
    copy_block(wg, 0, 0, on_gpu(src), 1, 0, 4, 5);
    EXPECT_TRUE(bitwise_equal(wg, whole)) << dtype_name(dt);
  }
}

// add_block (f32): one addition per element on either device, so bitwise the CPU's, with strided
// rows on both sides; the elements outside the block keep their values.
TEST(CopyCuda, AddBlockIsBitwiseTheCpus) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor src = random_tensor({2, 3, 9}, 73), dst = random_tensor({5, 7}, 74);
  Tensor dg = on_gpu(dst);
  add_block(dst, 1, 2, src, 2, 3, 4, 5);
  add_block(dg, 1, 2, on_gpu(src), 2, 3, 4, 5);
  EXPECT_TRUE(bitwise_equal(dg, dst));
}

}  // namespace
}  // namespace zaya::ops
