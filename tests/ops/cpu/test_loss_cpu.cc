// The CPU cross-entropy's own paths (ops/cpu/loss_cpu.cc): the fused strip-layout head against the
// row-major path and the float64 reference, and results that do not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/loss_reference.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/loss_cpu.h"
#include "zaya/ops/loss.h"

namespace zaya::ops {
namespace {

using loss_test::ce_reference;
using loss_test::make_targets;
using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;

TEST(CrossEntropy, BitwiseDeterministicAcrossThreadCounts) {
  const int64_t n = 64, hd = 48, v = 700;
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 31) % v);
  Tensor h = random_tensor({n, hd}, 1), E = random_tensor({v, hd}, 2), tg = make_targets(t);
  for (int64_t chunk : {128, 1024}) {  // recomputing backward; kept exps (one chunk covers V)
    CrossEntropyOptions opt{.chunk = chunk};
    int saved = num_threads();
    std::vector<double> losses;
    std::vector<Tensor> grads;
    for (int threads : {1, 2, 2, 1}) {
      set_num_threads(threads);
      Tensor ws = Tensor::empty({cross_entropy_workspace_elems(n, v, opt)}, DType::f32);
      Tensor lse = Tensor::empty({n}, DType::f32), dh = Tensor::empty({n, hd}, DType::f32);
      Tensor dE = Tensor::zeros({v, hd}, DType::f32);
      losses.push_back(cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt).loss);
      grads.push_back(dh);
      grads.push_back(dE);
    }
    set_num_threads(saved);
    for (size_t i = 1; i < losses.size(); ++i) {
      EXPECT_EQ(losses[i], losses[0]);
      EXPECT_EQ(0, std::memcmp(grads[2 * i].raw(), grads[0].raw(), grads[0].nbytes()));
      EXPECT_EQ(0, std::memcmp(grads[2 * i + 1].raw(), grads[1].raw(), grads[1].nbytes()));
    }
  }
}

// The kept-exps case (one chunk covers V) runs on the fused strip-layout head where the build has
// AVX-512 (cpu/tied_head_cpu.h) and on row-major logits with library GEMMs otherwise or when
// switched off. Both against the closed form in double, and against each other, on shapes that
// leave partial 16-token blocks, 16-column strips and 16-wide panels (n, V, hd not multiples of
// 16), span several of the fused path's forward blocks (32 vocabulary rows, the last one a single
// partial strip for V = 33 and 300; 8-token panels), dh's vocabulary blocks (256 rows), dE's strip
// groups (256 rows) and token blocks (256 tokens; both at once in 300 × 300), and have
// ignored rows and tokens sharing a target (dE's one-hot correction).
TEST(CrossEntropy, FusedHeadMatchesRowMajorPathAndReference) {
  struct Case {
    int64_t n, hd, v;
  };
  for (const Case c :
       {Case{7, 13, 50}, Case{70, 40, 600}, Case{150, 16, 33}, Case{2100, 8, 20}, Case{300, 24, 300}}) {
    std::vector<int32_t> t(c.n);
    for (int64_t i = 0; i < c.n; ++i) t[i] = i % 11 == 5 ? -100 : static_cast<int32_t>((i % 13) * 7 % c.v);
    Tensor h = random_tensor({c.n, c.hd}, 21, 1.5f), E = random_tensor({c.v, c.hd}, 22, 1.5f),
           tg = make_targets(t);
    Vec hv = to_f64(h), ev = to_f64(E), lse_ref;
    const double loss_ref = ce_reference(hv, ev, t, c.n, c.hd, c.v, &lse_ref);
    int64_t count = 0;
    for (int32_t x : t) count += x != -100;
    Vec dh_ref(c.n * c.hd, 0.0), de_ref(c.v * c.hd, 0.0);
    for (int64_t i = 0; i < c.n; ++i) {
      if (t[i] == -100) continue;
      for (int64_t j = 0; j < c.v; ++j) {
        double l = 0;
        for (int64_t k = 0; k < c.hd; ++k) l += hv[i * c.hd + k] * ev[j * c.hd + k];
        const double g = (std::exp(l - lse_ref[i]) - (j == t[i] ? 1.0 : 0.0)) / count;
        for (int64_t k = 0; k < c.hd; ++k) {
          dh_ref[i * c.hd + k] += g * ev[j * c.hd + k];
          de_ref[j * c.hd + k] += g * hv[i * c.hd + k];
        }
      }
    }
    std::vector<Tensor> out;
    std::vector<double> loss;
    for (bool fused : {true, false}) {
      cpu::cross_entropy_use_fused_head(fused);
      CrossEntropyOptions opt{.chunk = 8192};
      Tensor ws = Tensor::empty({cross_entropy_workspace_elems(c.n, c.v, opt)}, DType::f32);
      Tensor lse = Tensor::empty({c.n}, DType::f32), dh = random_tensor({c.n, c.hd}, 23);
      Tensor dE = Tensor::zeros({c.v, c.hd}, DType::f32);
      CrossEntropyResult r = cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
      const std::string where = str("n ", c.n, " hd ", c.hd, " v ", c.v, fused ? " fused" : " row-major");
      // f32 logits of up to 40 products and sums of up to 600 exponentials: ~1e-6 relative.
      EXPECT_NEAR(r.loss, loss_ref, 1e-5 * std::fabs(loss_ref)) << where;
      EXPECT_EQ(r.count, count) << where;
      EXPECT_LT(test::rel_error(lse, lse_ref), 1e-6) << where;
      EXPECT_LT(test::rel_error(dh, dh_ref), 5e-5) << where;
      EXPECT_LT(test::rel_error(dE, de_ref), 5e-5) << where;
      out.push_back(dh);
      out.push_back(dE);
      loss.push_back(r.loss);
    }
    cpu::cross_entropy_use_fused_head(true);
    // Same math, different f32 rounding (the logits' products in another order): ~1e-6 relative.
    EXPECT_NEAR(loss[0], loss[1], 1e-6 * std::fabs(loss[1]));
    EXPECT_LT(test::rel_error(out[0], to_f64(out[2])), 1e-5);
    EXPECT_LT(test::rel_error(out[1], to_f64(out[3])), 1e-5);
  }
}

}  // namespace
}  // namespace zaya::ops
