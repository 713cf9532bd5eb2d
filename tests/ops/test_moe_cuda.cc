// One test, two devices: MoE routing, the plan and the permutation on CUDA against the same ops on
// the CPU (the reference, itself tested in test_moe.cc), from the same inputs. Skipped with a
// message where no GPU is present (docs/cuda.md: scripts/gpu_check.sh runs them on one).
//
// What must agree, and how closely (fp32 on both devices):
// - exactly: the routing decisions (choices), the plan (counts, offsets, pos, src, M), the gathers,
//   the un-permutation and dy of its backward (copies and single products), and the router's
//   backward given the same probabilities (the shared row function rounds the same way on both).
// - probabilities and weights within 1e-6 relative per element (~8 ulp): the only difference is
//   the exponential (CUDA's expf ≤ 2 ulp, the C library's ≤ 1), then one division.
// - the un-permutation's dweight = ⟨dout, y⟩ within 1e-5 of Σ|dout·y| per row: a sum of H = 333
//   products in another order (a warp butterfly with FMAs against the CPU's 16 lanes); its rounding
//   error is ~√H ulp of that scale, 1e-5 being ~H ulp, the worst case.
// Exact choices need the biased scores not to lie within the exponentials' few ulp of each other;
// the random rows are nudged apart on the CPU first (a near-tie is a coin toss on any two exp
// implementations), and exact ties are made with equal logits, which both devices turn into the
// same probabilities bit for bit (exp(0) = 1), so the lowest index wins on both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cuda_compare.h"
#include "test_util.h"
#include "zaya/ops/moe.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::gpu_empty;
using test::on_gpu;
using test::random_tensor;

// 2500 tokens: more than two of the plan's 1024-token tiles; 16 experts as ZAYA1.
constexpr int64_t N = 2500, E = 16, K = E + 1;

// max over elements of |a − b| / max(|b|, tiny).
double max_rel_diff(const Tensor& on_cuda, const Tensor& on_cpu) {
  const std::vector<double> a = test::to_f64(on_cuda.to(Device::cpu)), b = test::to_f64(on_cpu);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-30));
  return worst;
}

// Router logits whose biased scores are clear of near-ties (gap ≥ 1e-4 between the best and the
// runner-up: far more than the exponentials' differences), with rows 0..9 all-equal (exact ties)
// and every 7th row sent to the skip class.
Tensor router_logits(const Tensor& beta) {
  Tensor z = random_tensor({N, K}, 41, 2.0f);
  float* p = z.data<float>();
  for (int64_t n = 0; n < 10; ++n) std::fill_n(p + n * K, K, 0.25f);
  for (int64_t n = 10; n < N; n += 7) p[n * K + E] += 8.0f;
  const float* b = beta.data<float>();
  for (int64_t n = 10; n < N; ++n) {
    for (int iter = 0; iter < 8; ++iter) {
      float* row = p + n * K;
      double mx = row[0], sum = 0;
      for (int64_t e = 1; e < K; ++e) mx = std::max<double>(mx, row[e]);
      for (int64_t e = 0; e < K; ++e) sum += std::exp(row[e] - mx);
      int64_t best = 0;
      double s1 = -1e30, s2 = -1e30;
      for (int64_t e = 0; e < K; ++e) {
        const double s = std::exp(row[e] - mx) / sum + b[e];
        if (s > s1)
          s2 = s1, s1 = s, best = e;
        else if (s > s2)
          s2 = s;
      }
      if (s1 - s2 >= 1e-4) break;
      row[best] += 0.5f;  // a clear winner
    }
  }
  return z;
}

TEST(MoeCuda, RoutingDecisionsMatchTheCpuExactly) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor beta = random_tensor({K}, 42, 0.05f);  // small: it changes some choices, not most
  Tensor z = router_logits(beta);
  Tensor probs = Tensor::empty({N, K}, DType::f32), choice = Tensor::empty({N}, DType::i32);
  Tensor weight = Tensor::empty({N}, DType::f32);
  moe_route(probs, choice, weight, z, beta, N, E);
  Tensor pg = gpu_empty({N, K}), cg = gpu_empty({N}, DType::i32), wg = gpu_empty({N});
  moe_route(pg, cg, wg, on_gpu(z), on_gpu(beta), N, E);
  EXPECT_TRUE(bitwise_equal(cg, choice));
  EXPECT_LT(max_rel_diff(pg, probs), 1e-6);
  EXPECT_LT(max_rel_diff(wg, weight), 1e-6);  // skipped tokens: 0 on both (relative to 1e-30)

  // Exact ties: equal logits, β with equal entries → the lowest index among the tied maxima on both.
  Tensor flat = Tensor::empty({3, K}, DType::f32);
  std::fill_n(flat.data<float>(), 3 * K, 1.5f);
  Tensor tie_beta = Tensor::zeros({K}, DType::f32);
  tie_beta.data<float>()[5] = tie_beta.data<float>()[9] = 0.125f;  // classes 5 and 9 tie above the rest
  Tensor tp = Tensor::empty({3, K}, DType::f32), tc = Tensor::empty({3}, DType::i32),
         tw = Tensor::empty({3}, DType::f32);
  moe_route(tp, tc, tw, flat, tie_beta, 3, E);
  Tensor tpg = gpu_empty({3, K}), tcg = gpu_empty({3}, DType::i32), twg = gpu_empty({3});
  moe_route(tpg, tcg, twg, on_gpu(flat), on_gpu(tie_beta), 3, E);
  EXPECT_EQ(tc.data<int32_t>()[0], 5);
  EXPECT_TRUE(bitwise_equal(tcg, tc));
  EXPECT_TRUE(bitwise_equal(tpg, tp));  // exp(0) = 1 and 1/K on both
}

TEST(MoeCuda, RouterBackwardIsBitwiseTheCpusGivenTheSameProbabilities) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor beta = random_tensor({K}, 43, 0.05f);
  Tensor z = router_logits(beta);
  Tensor probs = Tensor::empty({N, K}, DType::f32), choice = Tensor::empty({N}, DType::i32);
  Tensor weight = Tensor::empty({N}, DType::f32);
  moe_route(probs, choice, weight, z, beta, N, E);
  Tensor dweight = random_tensor({N}, 44);
  Tensor dz = Tensor::empty({N, K}, DType::f32), dzg = gpu_empty({N, K});
  moe_route_backward(dz, dweight, probs, choice, N, E);
  moe_route_backward(dzg, on_gpu(dweight), on_gpu(probs), on_gpu(choice), N, E);
  EXPECT_TRUE(bitwise_equal(dzg, dz));
}

// Choices with every case of the plan: skipped tokens, an expert with no token, runs of one expert
// across a tile boundary (tokens 1000..1100 all expert 3).
Tensor plan_choices() {
  Tensor c = Tensor::empty({N}, DType::i32);
  int32_t* p = c.data<int32_t>();
  uint64_t s = 12345;
  for (int64_t n = 0; n < N; ++n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int32_t v = static_cast<int32_t>((s >> 33) % (E + 1));
    if (v == 11) v = 12;  // expert 11 gets nothing
    p[n] = n >= 1000 && n < 1100 ? 3 : v;
  }
  return c;
}

TEST(MoeCuda, PlanIsTheCpusStableCountingSortExactly) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor choice = plan_choices();
  Tensor counts = Tensor::empty({E}, DType::i32), offsets = Tensor::empty({E + 1}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32), src = Tensor::zeros({N}, DType::i32);
  const int64_t M = moe_plan(counts, offsets, pos, src, choice, N, E);
  Tensor cg = gpu_empty({E}, DType::i32), og = gpu_empty({E + 1}, DType::i32),
         pg = gpu_empty({N}, DType::i32);
  Tensor sg = Tensor::zeros({N}, DType::i32).to(Device::cuda);
  const int64_t Mg = moe_plan(cg, og, pg, sg, on_gpu(choice), N, E);
  EXPECT_EQ(Mg, M);
  EXPECT_EQ(counts.data<int32_t>()[11], 0);
  EXPECT_TRUE(bitwise_equal(cg, counts));
  EXPECT_TRUE(bitwise_equal(og, offsets));
  EXPECT_TRUE(bitwise_equal(pg, pos));
  EXPECT_TRUE(bitwise_equal(sg, src));  // rows ≥ M untouched (0) on both
}

TEST(MoeCuda, PlanNamesTheFirstChoiceOutsideTheExperts) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor choice = plan_choices();
  choice.data<int32_t>()[1777] = E + 1;
  choice.data<int32_t>()[2001] = -3;
  Tensor cg = gpu_empty({E}, DType::i32), og = gpu_empty({E + 1}, DType::i32),
         pg = gpu_empty({N}, DType::i32);
  Tensor sg = gpu_empty({N}, DType::i32);
  const std::string msg = test::error_of([&] { moe_plan(cg, og, pg, sg, on_gpu(choice), N, E); });
  EXPECT_NE(msg.find("moe_plan: choice[1777] = 17, expected an expert in [0, 16]"), std::string::npos) << msg;
}

// The permutation on a plan from plan_choices(), for H = 333 (the scalar path) and 256 (float4).
TEST(MoeCuda, GatherUnpermuteAndTheirBackwardsMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  Tensor choice = plan_choices();
  Tensor counts = Tensor::empty({E}, DType::i32), offsets = Tensor::empty({E + 1}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32), src = Tensor::zeros({N}, DType::i32);
  const int64_t M = moe_plan(counts, offsets, pos, src, choice, N, E);
  Tensor pos_g = on_gpu(pos), src_g = on_gpu(src);
  Tensor weight = random_tensor({N}, 45), weight_g = on_gpu(weight);
  for (int64_t H : {int64_t{333}, int64_t{256}}) {
    SCOPED_TRACE(H);
    Tensor x = random_tensor({N, H}, 46), x_g = on_gpu(x);
    Tensor xp = Tensor::zeros({N, H}, DType::f32), xp_g = Tensor::zeros({N, H}, DType::f32).to(Device::cuda);
    moe_gather(xp, x, src, M, N, H);
    moe_gather(xp_g, x_g, src_g, M, N, H);
    EXPECT_TRUE(bitwise_equal(xp_g, xp));
    // One expert's rows alone, into a fresh buffer: the same rows, the others untouched.
    const int64_t r0 = offsets.data<int32_t>()[3], r1 = offsets.data<int32_t>()[4];
    Tensor part = Tensor::zeros({N, H}, DType::f32),
           part_g = Tensor::zeros({N, H}, DType::f32).to(Device::cuda);
    moe_gather_rows(part, x, src, r0, r1, N, H);
    moe_gather_rows(part_g, x_g, src_g, r0, r1, N, H);
    EXPECT_TRUE(bitwise_equal(part_g, part));

    Tensor dx = Tensor::empty({N, H}, DType::f32), dx_g = gpu_empty({N, H});
    moe_gather_backward(dx, xp, pos, M, N, H);
    moe_gather_backward(dx_g, xp_g, pos_g, M, N, H);
    EXPECT_TRUE(bitwise_equal(dx_g, dx));

    Tensor y = random_tensor({N, H}, 47), y_g = on_gpu(y);
    Tensor out = Tensor::empty({N, H}, DType::f32), out_g = gpu_empty({N, H});
    moe_unpermute(out, y, weight, pos, M, N, H);
    moe_unpermute(out_g, y_g, weight_g, pos_g, M, N, H);
    EXPECT_TRUE(bitwise_equal(out_g, out));

    Tensor dout = random_tensor({N, H}, 48);
    Tensor dy = Tensor::zeros({N, H}, DType::f32), dy_g = Tensor::zeros({N, H}, DType::f32).to(Device::cuda);
    Tensor dw = Tensor::empty({N}, DType::f32), dw_g = gpu_empty({N});
    moe_unpermute_backward(dy, dw, dout, y, weight, pos, M, N, H);
    moe_unpermute_backward(dy_g, dw_g, on_gpu(dout), y_g, weight_g, pos_g, M, N, H);
    EXPECT_TRUE(bitwise_equal(dy_g, dy));
    const Tensor dw_host = dw_g.to(Device::cpu);
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

}  // namespace
}  // namespace zaya::ops
