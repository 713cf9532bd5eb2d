// One test, two devices: ops::gemm, gemm_grouped, gemm_many and the linear layer's forward and
// backward on CUDA (cuBLASLt) against the same ops on the CPU (the reference, itself tested against
// float64 in test_gemm.cc and test_dense.cc), from the same random inputs. Skipped with a message
// where no GPU is present (docs/cuda.md: scripts/gpu_check.sh runs them on one).
//
// Tolerances (cuda_compare.h): a GEMM's result 4·(K + 2)·u norm-wise, for f32 and bf16 inputs
// alike; the bias gradient, a column sum over N rows, kColumnSums as in test_dense_cuda.cc; what is
// the same operations in the same order (a repeated call, k = 0, the bf16 cast of dy) bitwise.
//
// On every machine: how a row-major problem is handed to column-major cuBLASLt (lt_mapping), read
// back with cuBLAS's own semantics, is the row-major GEMM.
#include <gtest/gtest.h>

#include <vector>

#include "ops/cuda_compare.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/cuda/cublaslt_gemm.h"
#include "zaya/ops/gemm_many.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::gemm_tolerance;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

// Random-sign sums over 300 rows with cancellation: ~N ulp of the largest term over the sum's size.
constexpr double kColumnSums = 1e-4;

Shape op_shape(Trans t, int64_t rows, int64_t cols) { return t == Trans::N ? Shape{rows, cols} : Shape{cols, rows}; }

// Odd sizes: no multiple of a tile, a warp or a vector width; K = 300 crosses any K blocking.
constexpr int64_t M = 37, Nn = 53, K = 300;

// cuBLAS's D = op(A)·op(B) on column-major buffers (element (r, c) of a layout at r + c·ld), with
// the shapes checked as cublasLtMatmul checks them.
std::vector<double> column_major_gemm(const cuda::LtMapping& mp, const std::vector<double>& a,
                                      const std::vector<double>& b) {
  const int64_t m = mp.trans_a ? mp.a.cols : mp.a.rows, k = mp.trans_a ? mp.a.rows : mp.a.cols;
  const int64_t kb = mp.trans_b ? mp.b.cols : mp.b.rows, n = mp.trans_b ? mp.b.rows : mp.b.cols;
  EXPECT_EQ(k, kb);
  EXPECT_EQ(mp.c.rows, m);
  EXPECT_EQ(mp.c.cols, n);
  auto op = [](const std::vector<double>& x, const cuda::LtLayout& l, bool t, int64_t i, int64_t p) {
    return t ? x[static_cast<size_t>(p + i * l.ld)] : x[static_cast<size_t>(i + p * l.ld)];
  };
  std::vector<double> d(static_cast<size_t>(mp.c.ld * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += op(a, mp.a, mp.trans_a, i, p) * op(b, mp.b, mp.trans_b, p, j);
      d[static_cast<size_t>(i + j * mp.c.ld)] = s;
    }
  return d;
}

TEST(CublasLtMapping, TheColumnMajorProblemIsTheRowMajorGemm) {
  const int64_t m = 5, n = 7, k = 3;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      // Small integers: every sum exact.
      std::vector<double> A(m * k), B(k * n);
      for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<double>((i * 7) % 11) - 5;
      for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<double>((i * 5) % 13) - 6;
      auto a_at = [&](int64_t i, int64_t p) { return ta == Trans::N ? A[i * k + p] : A[p * m + i]; };
      auto b_at = [&](int64_t p, int64_t j) { return tb == Trans::N ? B[p * n + j] : B[j * k + p]; };
      std::vector<double> want(m * n, 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t p = 0; p < k; ++p) want[i * n + j] += a_at(i, p) * b_at(p, j);
      // cuBLASLt's A is our B and its B our A; its column-major D is our row-major C.
      const cuda::LtMapping mp = cuda::lt_mapping(m, n, k, ta, tb);
      EXPECT_EQ(column_major_gemm(mp, B, A), want) << "ta " << (ta == Trans::T) << " tb " << (tb == Trans::T);
    }
}

TEST(GemmCuda, MatchesTheCpuForEveryTransposeDtypeAndBeta) {
  ZAYA_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16})
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T})
        for (float beta : {0.0f, 0.5f}) {
          Tensor A = random_tensor(op_shape(ta, M, K), ++seed, 1.0f, dt);
          Tensor B = random_tensor(op_shape(tb, K, Nn), ++seed, 1.0f, dt);
          Tensor C0 = random_tensor({M, Nn}, ++seed);
          Tensor C = C0.clone(), Cg = on_gpu(C0);
          gemm(C, A, ta, B, tb, 1.5f, beta);
          gemm(Cg, on_gpu(A), ta, on_gpu(B), tb, 1.5f, beta);
          EXPECT_LT(rel_diff(Cg, C), gemm_tolerance(K))
              << dtype_name(dt) << " ta " << (ta == Trans::T) << " tb " << (tb == Trans::T) << " beta " << beta;
        }
}

TEST(GemmCuda, BatchedFormsMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t bt = 3;
  uint64_t seed = 100;
  for (Trans ta : {Trans::N, Trans::T})
    for (bool shared_b : {false, true}) {  // B per batch entry (strided batch) or one B for all
      Shape a_shape = op_shape(ta, M, K);
      Tensor A = random_tensor({bt, a_shape[0], a_shape[1]}, ++seed);
      Tensor B = shared_b ? random_tensor({K, Nn}, ++seed) : random_tensor({bt, K, Nn}, ++seed);
      Tensor C0 = random_tensor({bt, M, Nn}, ++seed);
      Tensor C = C0.clone(), Cg = on_gpu(C0);
      gemm(C, A, ta, B, Trans::N, 1.0f, 1.0f);
      gemm(Cg, on_gpu(A), ta, on_gpu(B), Trans::N, 1.0f, 1.0f);
      EXPECT_LT(rel_diff(Cg, C), gemm_tolerance(K)) << "ta " << (ta == Trans::T) << " shared B " << shared_b;
    }
}

TEST(GemmCuda, EmptySumsAndRepeatsAreExactAndPlansAreCached) {
  ZAYA_SKIP_WITHOUT_GPU();
  // k = 0: C = beta·C, and exactly 0 for beta = 0 even over NaN (as on the CPU).
  Tensor A = Tensor::empty({M, 0}, DType::f32, Device::cuda), B = Tensor::empty({0, Nn}, DType::f32, Device::cuda);
  Tensor C0 = random_tensor({M, Nn}, 200);
  C0.data<float>()[5] = NAN;
  Tensor Cg = on_gpu(C0), C = C0.clone();
  gemm(Cg, A, Trans::N, B, Trans::N, 1.0f, 0.0f);
  gemm(C, Tensor::empty({M, 0}, DType::f32), Trans::N, Tensor::empty({0, Nn}, DType::f32), Trans::N, 1.0f, 0.0f);
  EXPECT_TRUE(bitwise_equal(Cg, C));
  EXPECT_TRUE(bitwise_equal(Cg, Tensor::zeros({M, Nn}, DType::f32)));

  // The same call twice: the same bits, and the second adds no plan (no heuristic query).
  Tensor X = on_gpu(random_tensor({M, K}, 201)), W = on_gpu(random_tensor({Nn, K}, 202));
  Tensor Y1 = Tensor::empty({M, Nn}, DType::f32, Device::cuda), Y2 = Tensor::empty({M, Nn}, DType::f32, Device::cuda);
  gemm(Y1, X, Trans::N, W, Trans::T);
#if defined(ZAYA_HAVE_CUDA)
  const int64_t plans = cuda::lt_plan_count();
  gemm(Y2, X, Trans::N, W, Trans::T);
  EXPECT_EQ(cuda::lt_plan_count(), plans);
#endif
  EXPECT_TRUE(bitwise_equal(Y1, Y2));
}

TEST(GemmCuda, GroupedAndManyMatchTheCpuAndEachGemmAlone) {
  ZAYA_SKIP_WITHOUT_GPU();
  // Expert-like problems: rows vary, one has none.
  const int64_t rows[] = {17, 0, 64, 5};
  std::vector<GemmProblem> cpu, gpu;
  uint64_t seed = 300;
  for (int64_t r : rows) {
    Tensor A = random_tensor({r, K}, ++seed), B = random_tensor({Nn, K}, ++seed), C = random_tensor({r, Nn}, ++seed);
    cpu.push_back({A, B, C});
    gpu.push_back({on_gpu(A), on_gpu(B), on_gpu(C)});
  }
  gemm_grouped(cpu, Trans::N, Trans::T, 1.0f, 1.0f);
  gemm_grouped(gpu, Trans::N, Trans::T, 1.0f, 1.0f);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_LT(rel_diff(gpu[i].C, cpu[i].C), gemm_tolerance(K)) << i;

  // gemm_many: each problem's bits are ops::gemm's alone. Cᵢ [K, K] += AᵢᵀAᵢ (a weight gradient's
  // form, dW += dyᵀ·x; the empty expert gives C = C).
  std::vector<GemmProblem> many;
  for (const GemmProblem& p : gpu) many.push_back({p.A, p.A, on_gpu(random_tensor({K, K}, ++seed))});
  std::vector<Tensor> alone;
  for (const GemmProblem& p : many) {
    alone.push_back(p.C.clone());
    gemm(alone.back(), p.A, Trans::T, p.B, Trans::N, 1.0f, 1.0f);
  }
  gemm_many(many, Trans::T, Trans::N, 1.0f, 1.0f);
  for (size_t i = 0; i < many.size(); ++i) EXPECT_TRUE(bitwise_equal(many[i].C, alone[i])) << i;
}

TEST(LinearCuda, ForwardMatchesTheCpuWithAndWithoutTheBiasEpilogue) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t n = 300, in = 333, out = 129;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = random_tensor({n, in}, 400, 1.0f, dt), W = random_tensor({out, in}, 401, 1.0f, dt);
    Tensor b = random_tensor({out}, 402);
    Tensor xg = on_gpu(x), Wg = on_gpu(W);
    // The bias as an aligned tensor (the epilogue) and at a 4-byte offset (the separate pass).
    Tensor b_host_room = Tensor::zeros({out + 1}, DType::f32);
    std::copy_n(b.data<float>(), out, b_host_room.data<float>() + 1);
    Tensor b_room = on_gpu(b_host_room);
    const Tensor b_aligned = on_gpu(b), b_offset = b_room.window(1, Shape{out});
    Tensor y = Tensor::empty({n, out}, DType::f32), y0 = Tensor::empty({n, out}, DType::f32);
    linear_forward(y, x, W, b);
    linear_forward(y0, x, W, Tensor{});
    for (const Tensor* bias : {&b_aligned, &b_offset}) {
      Tensor yg = Tensor::empty({n, out}, DType::f32, Device::cuda);
      linear_forward(yg, xg, Wg, *bias);
      EXPECT_LT(rel_diff(yg, y), gemm_tolerance(in)) << dtype_name(dt) << (bias == &b_aligned ? " fused" : " offset");
    }
    Tensor yg0 = Tensor::empty({n, out}, DType::f32, Device::cuda);
    linear_forward(yg0, xg, Wg, Tensor{});
    EXPECT_LT(rel_diff(yg0, y0), gemm_tolerance(in)) << dtype_name(dt) << " no bias";
  }
}

TEST(LinearCuda, BackwardMatchesTheCpuAccumulatingEveryGradient) {
  ZAYA_SKIP_WITHOUT_GPU();
  const int64_t n = 300, in = 333, out = 129;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = random_tensor({n, in}, 500, 1.0f, dt), W = random_tensor({out, in}, 501, 1.0f, dt);
    Tensor dy = random_tensor({n, out}, 502);
    Tensor dx0 = random_tensor({n, in}, 503), dW0 = random_tensor({out, in}, 504), db0 = random_tensor({out}, 505);
    Tensor dy16 = dt == DType::bf16 ? Tensor::empty({n, out}, DType::bf16) : Tensor{};
    Tensor dy16g = dt == DType::bf16 ? Tensor::empty({n, out}, DType::bf16, Device::cuda) : Tensor{};
    for (bool acc : {false, true}) {
      Tensor dx = dx0.clone(), dW = dW0.clone(), db = db0.clone();
      Tensor dxg = on_gpu(dx0), dWg = on_gpu(dW0), dbg = on_gpu(db0);
      linear_backward(dx, dW, db, dy, x, W, dy16, acc);
      linear_backward(dxg, dWg, dbg, on_gpu(dy), on_gpu(x), on_gpu(W), dy16g, acc);
      const char* what = dt == DType::bf16 ? "bf16" : "f32";
      EXPECT_LT(rel_diff(dxg, dx), gemm_tolerance(out)) << what << " accumulate_dx " << acc;
      EXPECT_LT(rel_diff(dWg, dW), gemm_tolerance(n)) << what;
      EXPECT_LT(rel_diff(dbg, db), kColumnSums) << what;
      if (dt == DType::bf16) {
        EXPECT_TRUE(bitwise_equal(dy16g, dy16));  // the shared to_bf16 rounding
      }
    }
  }
}

}  // namespace
}  // namespace zaya::ops
