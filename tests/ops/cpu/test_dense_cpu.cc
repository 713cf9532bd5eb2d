// The CPU dense kernels' own choices (ops/cpu/dense_cpu.cc): softmax's store modes give the same
// bits, and every dense op's results do not depend on the thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ops/gradcheck.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/dense_cpu.h"
#include "zaya/ops/dense.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

struct Rows {
  int64_t n, f;
};

// Outputs larger than the caches are written with streaming stores from a row buffer; the values
// must be the very same floats as the plain path's (bitwise), for rows that start at any alignment
// (f = 1000 and 37 are not multiples of 16 floats, so most rows start mid-cache-line).
TEST(Activations, SoftmaxStreamingStoresGiveTheSameBits) {
  for (Rows s : {Rows{37, 1000}, Rows{5, 37}, Rows{3, 2048}}) {
    Tensor x = random_tensor({s.n, s.f}, 11, 3.0f);
    Tensor a = Tensor::empty({s.n, s.f}, DType::f32), b = Tensor::empty({s.n, s.f}, DType::f32);
    cpu::softmax_forward(a, x, cpu::StoreMode::cached);
    cpu::softmax_forward(b, x, cpu::StoreMode::streaming);
    for (int64_t i = 0; i < a.numel(); ++i)
      ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << s.n << "x" << s.f << " at " << i;
  }
}

// ------------------------------------------------------------------------------------ determinism
// Every op's outputs and gradients, bitwise, over 1, 2, 2, 1 threads.
std::vector<Tensor> run_all(int threads) {
  set_num_threads(threads);
  const int64_t n = 150, f = 200, out = 96, vocab = 50;  // n: 3 row chunks of the norms (64, 64, 22)
  Tensor x = random_tensor({n, f}, 1), w = random_tensor({f}, 2), g = random_tensor({n, f}, 3);
  Tensor W = random_tensor({out, f}, 4), b = random_tensor({out}, 5), gy = random_tensor({n, out}, 6);
  std::vector<Tensor> r;
  auto add = [&](Shape s) { return r.emplace_back(Tensor::zeros(s, DType::f32)); };
  linear_forward(add({n, out}), x, W, b);
  linear_backward(add({n, f}), add({out, f}), add({out}), gy, x, W);
  Tensor y = add({n, f}), rstd = add({n});
  rmsnorm_forward(y, rstd, x, w, 1e-5f);
  rmsnorm_backward(add({n, f}), add({f}), g, x, w, rstd);
  ResidualScaleParams p{w, w, random_tensor({f}, 7), random_tensor({f}, 8)};
  residual_scale_forward(add({n, f}), g, x, p);
  ResidualScaleParams grads{add({f}), add({f}), add({f}), add({f})};
  residual_scale_backward(add({n, f}), add({n, f}), grads, g, g, x, p);
  Tensor ids = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % vocab);
  embedding_backward(add({vocab, f}), g, ids, 3);
  softmax_forward(y, x);
  softmax_backward(add({n, f}), g, y);
  gelu_backward(add({n, f}), g, x);
  swiglu_backward(add({n, f}), random_tensor({n, f / 2}, 9), x);
  return r;
}

TEST(Dense, BitwiseDeterministicAcrossThreadCounts) {
  int saved = num_threads();
  auto a = run_all(1), b = run_all(2), c = run_all(2), d = run_all(1);
  set_num_threads(saved);
  for (size_t i = 0; i < a.size(); ++i)
    for (const auto* o : {&b, &c, &d})
      EXPECT_EQ(0, std::memcmp(a[i].raw(), (*o)[i].raw(), a[i].nbytes())) << "output " << i;
}

}  // namespace
}  // namespace zaya::ops
