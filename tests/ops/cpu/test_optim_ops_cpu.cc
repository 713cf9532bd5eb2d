// The CPU optimizer kernels' own paths (ops/cpu/optim_ops_cpu.cc): AdamW's AVX-512 body and its
// scalar tail give the same bits.
#include <gtest/gtest.h>

#include <vector>

#include "ops/gradcheck.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

// The update runs 16 elements at a time where the CPU has AVX-512 and one at a time for the rest;
// both must give bitwise the same numbers. A 1-element tensor takes the scalar path only, so each
// element of a 2·16 + 5 element update is replayed alone and compared exactly.
TEST(AdamW, VectorAndScalarPathsAgreeBitwise) {
  const int64_t n = 37;
  AdamWHyper hp{.lr = 0.02f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Tensor p = random_tensor({n}, 1), m = random_tensor({n}, 2, 0.1f), v = random_tensor({n}, 3, 0.1f);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] *= v.data<float>()[i];  // a second moment: >= 0
  v.data<float>()[5] = 0.0f;  // sqrt(0) + eps in the denominator
  Tensor g = random_tensor({n}, 4);
  std::vector<float> p1(n), m1(n), v1(n);
  for (int64_t i = 0; i < n; ++i) {
    auto one = [&](const Tensor& t) {
      Tensor s = Tensor::empty({1}, DType::f32);
      s.data<float>()[0] = t.data<float>()[i];
      return s;
    };
    Tensor pi = one(p), mi = one(m), vi = one(v), gi = one(g);
    adamw_update(pi, mi, vi, gi, hp, 3);
    p1[i] = pi.data<float>()[0], m1[i] = mi.data<float>()[0], v1[i] = vi.data<float>()[0];
  }
  adamw_update(p, m, v, g, hp, 3);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.data<float>()[i], p1[i]) << "p[" << i << "]";
    EXPECT_EQ(m.data<float>()[i], m1[i]) << "m[" << i << "]";
    EXPECT_EQ(v.data<float>()[i], v1[i]) << "v[" << i << "]";
  }
}

}  // namespace
}  // namespace zaya::ops
