// GEMM against a float64 reference: every transpose combination, beta 0/1, odd shapes, bf16,
// batched, errors, and the device dispatch. The grouped (expert) products are in
// test_gemm_grouped.cc; the CPU's own paths (thread counts, AVX2 paths, time counters) in
// cpu/test_gemm_cpu.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "ops/device_dispatch.h"
#include "ops/gemm_reference.h"
#include "ops/gradcheck.h"
#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/amx_gemm.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops {
namespace {

using namespace gemm_test;

class GemmF32 : public ::testing::TestWithParam<std::tuple<Dims, Trans, Trans, float>> {};

TEST_P(GemmF32, MatchesFloat64Reference) {
  auto [d, ta, tb, beta] = GetParam();
  Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 1);
  Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 2);
  Tensor C = random_tensor({d.m, d.n}, 3);
  auto ref = gemm_reference(to_f64(A), ta, to_f64(B), tb, to_f64(C), 1, d.m, d.n, d.k, 0.75, beta);
  gemm(C, A, ta, B, tb, 0.75f, beta);
  // f32 products summed over K <= 64 terms: rounding grows like sqrt(K)·2^-24 (~5e-7) in norm;
  // 1e-5 leaves a 20x margin and still catches any indexing or transpose mistake (errors O(1)).
  EXPECT_LT(test::rel_error(C, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmF32,
    ::testing::Combine(::testing::Values(Dims{1, 1, 1}, Dims{5, 17, 3}, Dims{64, 48, 33}, Dims{7, 13, 64}),
                       ::testing::Values(Trans::N, Trans::T), ::testing::Values(Trans::N, Trans::T),
                       ::testing::Values(0.0f, 1.0f)));

TEST(Gemm, Bf16InputsAccumulateInF32) {
  for (Dims d : {Dims{1, 1, 1}, Dims{5, 17, 3}, Dims{64, 48, 33}}) {
    for (Trans ta : {Trans::N, Trans::T}) {
      for (Trans tb : {Trans::N, Trans::T}) {
        Tensor Af = random_tensor(operand_shape(d.m, d.k, ta), 11);
        Tensor Bf = random_tensor(operand_shape(d.k, d.n, tb), 12);
        Tensor A = random_tensor(operand_shape(d.m, d.k, ta), 11, 1.0f, DType::bf16);  // same values, rounded
        Tensor B = random_tensor(operand_shape(d.k, d.n, tb), 12, 1.0f, DType::bf16);
        Tensor C = random_tensor({d.m, d.n}, 13);
        auto c0 = to_f64(C);
        gemm(C, A, ta, B, tb, 1.0f, 1.0f);
        // (1) On the bf16-rounded inputs (exact in double) only the f32 accumulation differs:
        // same 1e-5 bound as the f32 test.
        auto exact = gemm_reference(to_f64(A), ta, to_f64(B), tb, c0, 1, d.m, d.n, d.k, 1, 1);
        EXPECT_LT(test::rel_error(C, exact), 1e-5);
        // (2) Against the unrounded f32 inputs: each input carries relative rounding <= 2^-8, so each
        // product is off by <= (2·2^-8 + 2^-16)|a||b|; bound elementwise by that times sum|a||b|,
        // plus 1e-5·(sum|a||b| + |c0|) for the f32 accumulation.
        auto absA = to_f64(Af), absB = to_f64(Bf);
        for (auto& x : absA) x = std::fabs(x);
        for (auto& x : absB) x = std::fabs(x);
        auto mag =
            gemm_reference(absA, ta, absB, tb, std::vector<double>(c0.size(), 0.0), 1, d.m, d.n, d.k, 1, 0);
        auto ref = gemm_reference(to_f64(Af), ta, to_f64(Bf), tb, c0, 1, d.m, d.n, d.k, 1, 1);
        auto got = to_f64(C);
        double u = std::ldexp(1.0, -8);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::fabs(got[i] - ref[i]), (2 * u + u * u) * mag[i] + 1e-5 * (mag[i] + std::fabs(c0[i])))
              << "element " << i << " of " << d.m << "x" << d.n << "x" << d.k;
      }
    }
  }
}

TEST(Gemm, BatchedAndBroadcastB) {
  const int64_t z = 3, m = 5, n = 4, k = 7;
  for (bool shared : {false, true}) {
    Tensor A = random_tensor({z, k, m}, 21);  // Trans::T
    Tensor B = shared ? random_tensor({k, n}, 22) : random_tensor({z, k, n}, 22);
    Tensor C = random_tensor({z, m, n}, 23);
    auto ref = gemm_reference(to_f64(A), Trans::T, to_f64(B), Trans::N, to_f64(C), z, m, n, k, 1, 1, shared);
    gemm(C, A, Trans::T, B, Trans::N, 1.0f, 1.0f);
    // Same f32 accumulation bound as above (K = 7).
    EXPECT_LT(test::rel_error(C, ref), 1e-5) << "shared B: " << shared;
  }
}

TEST(Gemm, ZeroInnerDimScalesC) {
  Tensor A = Tensor::empty({4, 0}, DType::f32), B = Tensor::empty({0, 3}, DType::f32);
  Tensor C = random_tensor({4, 3}, 5);
  auto c0 = to_f64(C);
  gemm(C, A, Trans::N, B, Trans::N, 1.0f, 0.5f);
  for (int64_t i = 0; i < C.numel(); ++i) EXPECT_EQ(C.data<float>()[i], static_cast<float>(0.5 * c0[i]));
}

using zaya::test::error_of;

TEST(Gemm, ShapeErrorsNameBothShapes) {
  Tensor A = random_tensor({5, 7}, 1), B = random_tensor({6, 4}, 2), C = Tensor::empty({5, 4}, DType::f32);
  std::string msg = error_of([&] { gemm(C, A, Trans::N, B, Trans::N); });
  EXPECT_NE(msg.find("[5, 7]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[6, 4]"), std::string::npos) << msg;
  Tensor B2 = random_tensor({7, 4}, 2), C2 = Tensor::empty({4, 5}, DType::f32);
  msg = error_of([&] { gemm(C2, A, Trans::N, B2, Trans::N); });
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5, 4]"), std::string::npos) << msg;
  Tensor Ab = random_tensor({5, 7}, 1, 1.0f, DType::bf16);
  EXPECT_THROW(gemm(C, Ab, Trans::N, B2, Trans::N), Error);  // mixed dtypes
  EXPECT_THROW(gemm(A, A, Trans::N, B2, Trans::N), Error);   // C is not [5, 4]
}

// gemm and gemm_grouped handed CUDA tensors (host memory labelled CUDA: device_dispatch.h) check
// them as on the CPU; where no GPU is present their CUDA kernels (cuda/gemm.cu) then say so, naming
// the op, before anything is launched (with a GPU, test_gemm_cuda.cc runs them on device memory).
TEST(GemmDevice, CudaTensorsAreCheckedAndNeedAGpu) {
  // Host buffers kept alive (CudaLabelled): the front compares the operands' addresses (C must not
  // overlap A or B), which freed temporaries could share.
  test::CudaLabelled cu;
  Tensor A = cu({5, 4}), B = cu({4, 3}), C = cu({5, 3});
  // The shape checks hold for CUDA operands too.
  EXPECT_NE(error_of([&] { gemm(C, A, Trans::T, B, Trans::N); }).find("inner dims differ"), std::string::npos);
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_gemm_cuda.cc runs these ops on it";
  test::expect_needs_gpu("gemm", [&] { gemm(C, A, Trans::N, B, Trans::N); });
  std::vector<GemmProblem> ps{{A, B, C}, {A, B, C}};
  test::expect_needs_gpu("gemm_grouped", [&] { gemm_grouped(ps, Trans::N, Trans::N); });
}

TEST(GemmDevice, MixedDevicesAreRejectedNamingTheOperand) {
  Tensor A = random_tensor({5, 4}, 1), B = random_tensor({4, 3}, 2), C = Tensor::empty({5, 3}, DType::f32);
  Tensor Bc = test::as_cuda(B);
  test::expect_mixed_devices("gemm", "B", [&] { gemm(C, A, Trans::N, Bc, Trans::N); });
  std::vector<GemmProblem> ps{{A, B, C}, {A, Bc, C}};
  test::expect_mixed_devices("gemm_grouped", "problems[1].B", [&] { gemm_grouped(ps, Trans::N, Trans::N); });
}

}  // namespace
}  // namespace zaya::ops
