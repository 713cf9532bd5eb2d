// CUDA GEMMs and linear layers (gemm_cuda.h): cuBLASLt matmuls (cublaslt_gemm_cuda.cc) and the
// few passes around them: C = beta·C for an empty sum, a bias added where the epilogue cannot take
// it, the bias gradient as deterministic column sums.
#include <cstdint>

#include "zaya/ops/cuda/cublaslt_gemm.h"
#include "zaya/ops/cuda/gemm_cuda.h"
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// C = beta·C, exactly 0 for beta = 0 even over NaN (an empty sum: k = 0).
__global__ void scale_kernel(float* c, int64_t n, float beta) {
  GRID_STRIDE(i, n) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

// y[i, j] += b[j].
__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) y[i] += b[i % cols];
}

// Column sums' term and finish for the bias gradient: Σ_i dy[i, j], added to db[j].
struct RowTerm {
  const float* dy;
  int64_t cols;
  __device__ float operator()(int64_t i, int64_t j) const { return dy[i * cols + j]; }
};
struct AddTo {
  float* out;
  __device__ void operator()(int64_t j, float total) const { out[j] += total; }
};

const char* bytes_at(const Tensor& t, int64_t elems) {
  return static_cast<const char*>(t.raw()) + elems * static_cast<int64_t>(dtype_size(t.dtype()));
}

// One matmul over C = alpha·op(A)·op(B) + beta·C (+ bias) for 2-D operands, or `batch` of them at
// the given element strides. False where cuBLASLt has no bias epilogue for it (nothing queued).
bool matmul(std::string_view op, int64_t m, int64_t n, int64_t k, const void* A, Trans ta, const void* B, Trans tb,
            float* C, DType in, float alpha, float beta, const float* bias = nullptr, int64_t batch = 1,
            int64_t stride_a = 0, int64_t stride_b = 0, int64_t stride_c = 0) {
  LtProblem p;
  p.m = m, p.n = n, p.k = k, p.ta = ta, p.tb = tb, p.in = in, p.A = A, p.B = B, p.C = C, p.bias = bias;
  p.batch = batch, p.stride_a = stride_a, p.stride_b = stride_b, p.stride_c = stride_c;
  return lt_matmul(op, p, alpha, beta);
}

void gemm_named(std::string_view op, const GemmDims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb,
                const Tensor& C, float alpha, float beta) {
  auto& ctx = context_for(op);
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  float* c = C.data<float>();
  if (d.k == 0) {
    scale_kernel<<<blocks_for(C.numel()), kThreads, 0, stream_of(ctx)>>>(c, C.numel(), beta);
    check_launch(op);
    return;
  }
  const DType in = A.dtype();
  const bool batched = A.ndim() == 3;
  if (!batched) {
    matmul(op, d.m, d.n, d.k, A.raw(), ta, B.raw(), tb, c, in, alpha, beta);
    return;
  }
  if (B.ndim() == 3) {  // a B per batch entry: one strided-batched matmul
    matmul(op, d.m, d.n, d.k, A.raw(), ta, B.raw(), tb, c, in, alpha, beta, nullptr, d.batch, d.m * d.k, d.k * d.n,
           d.m * d.n);
    return;
  }
  if (ta == Trans::N) {  // one B for all: the batch's rows stacked are one [batch·m, k] matrix
    matmul(op, d.batch * d.m, d.n, d.k, A.raw(), ta, B.raw(), tb, c, in, alpha, beta);
    return;
  }
  for (int64_t e = 0; e < d.batch; ++e)  // Aᵀ per entry with one B: no common stacked form
    matmul(op, d.m, d.n, d.k, bytes_at(A, e * d.m * d.k), ta, B.raw(), tb, c + e * d.m * d.n, in, alpha, beta);
}

}  // namespace

void gemm(const GemmDims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha,
          float beta) {
  gemm_named("gemm", d, A, ta, B, tb, C, alpha, beta);
}

void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  for (const GemmProblem& p : problems)
    gemm_named("gemm_grouped", gemm_dims(p.A, ta, p.B, tb), p.A, ta, p.B, tb, p.C, alpha, beta);
}

void gemm_many(std::span<const GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  context_for("gemm_many");  // without a GPU, the error names this op rather than ops::gemm
  for (const GemmProblem& p : problems) ops::gemm(p.C, p.A, ta, p.B, tb, alpha, beta);
}

// ---------------------------------------------------------------------------------------------
// linear: y = x·Wᵀ + b.  dx = dy·W,  dW += dyᵀ·x,  db += Σ_rows dy.

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& W, const Tensor& b) {
  constexpr std::string_view op = "linear_forward";
  auto& ctx = context_for(op);
  const int64_t n = x.size(0), in = x.size(1), out = W.size(0);
  if (n == 0 || out == 0) return;
  float* yp = y.data<float>();
  if (in == 0) {  // an empty sum: y = b (or 0)
    scale_kernel<<<blocks_for(y.numel()), kThreads, 0, stream_of(ctx)>>>(yp, y.numel(), 0.0f);
    check_launch(op);
  } else {
    // The epilogue reads the bias through vector loads: only a 16-byte-aligned one is handed to it,
    // and where cuBLASLt has no bias epilogue for the problem the plain matmul runs instead.
    const bool fused = b.defined() && reinterpret_cast<uintptr_t>(b.raw()) % 16 == 0 &&
                 matmul(op, n, out, in, x.raw(), Trans::N, W.raw(), Trans::T, yp, x.dtype(), 1.0f, 0.0f,
                        b.data<float>());
    if (!fused) matmul(op, n, out, in, x.raw(), Trans::N, W.raw(), Trans::T, yp, x.dtype(), 1.0f, 0.0f);
    if (fused || !b.defined()) return;
  }
  if (!b.defined()) return;
  add_bias_kernel<<<blocks_for(n * out), kThreads, 0, stream_of(ctx)>>>(yp, b.data<float>(), n, out);
  check_launch(op);
}

void linear_backward(const Tensor& dx, const Tensor& dW, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& W, const Tensor& dy_bf16, bool accumulate_dx) {
  constexpr std::string_view op = "linear_backward";
  auto& ctx = context_for(op);
  const int64_t n = x.size(0), out = W.size(0);
  // The GEMM operand that stands for dy: dy itself (f32), or its bf16 copy next to bf16 x and W.
  Tensor g = dy;
  if (x.dtype() == DType::bf16) {
    ops::cast_to_bf16(dy_bf16, dy);
    g = dy_bf16;
  }
  if (dx.defined()) ops::gemm(dx, g, Trans::N, W, Trans::N, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  if (dW.defined()) ops::gemm(dW, g, Trans::T, x, Trans::N, 1.0f, 1.0f);
  if (db.defined()) {
    column_sums(op, ctx, n, out, RowTerm{dy.data<float>(), out}, AddTo{db.data<float>()});
  }
}

}  // namespace zaya::ops::cuda
