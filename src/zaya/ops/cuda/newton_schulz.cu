// CUDA Newton–Schulz orthogonalization (optim_cuda.h), step for step the CPU's
// (cpu/newton_schulz_cpu.cc): the same normalization (‖G‖_F in the CPU's double order), the same
// linear-path rule, the same quintic with its GEMMs batched (cuBLASLt strided-batched matmuls
// through ops::gemm) and, in bf16, the same roundings of X, A and B before each GEMM.
#include <cmath>
#include <cstdint>
#include <utility>

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/optim_cuda.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// scaled = s·src and, where low is given, low = bf16(src) (the CPU's scale_and_round).
__global__ void scale_and_round_kernel(float* scaled, bf16* low, const float* src, float s, int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = src[i];
    scaled[i] = s * x;
    if (low) low[i] = to_bf16(x);
  }
}

void scale_and_round(std::string_view op, zaya::cuda::DeviceContext& ctx, const Tensor& src, float s,
                     const Tensor& scaled, const Tensor& low) {
  const int64_t n = src.numel();
  scale_and_round_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
      scaled.data<float>(), low.defined() ? low.data<bf16>() : nullptr, src.data<float>(), s, n);
  check_launch(op);
}

// Per matrix e, from its Σ G²: X₀'s scale 1/(‖G‖ + 1e-7), or 0 with linear[e] = a^steps/(‖G‖ + 1e-7)
// where ‖X₀‖·a^steps < kLinearNorm (cpu/newton_schulz_cpu.cc says why), all in the CPU's doubles.
constexpr double kLinearNorm = 1e-4;
__global__ void coefficients_kernel(float* scale, float* linear, const double* sums, int64_t batch, double growth) {
  GRID_STRIDE(e, batch) {
    const double norm = sqrt(0.0 + sums[e]);  // global_grad_norm's total over one tensor
    const bool tiny = norm / (norm + 1e-7) * growth < kLinearNorm;
    linear[e] = tiny ? static_cast<float>(growth / (norm + 1e-7)) : 0.0f;
    scale[e] = tiny ? 0.0f : static_cast<float>(1.0 / (norm + 1e-7));
  }
}

// X[e] = scale[e]·G[e].
__global__ void normalize_kernel(float* X, const float* G, const float* scale, int64_t rc, int64_t n) {
  GRID_STRIDE(i, n) X[i] = scale[i / rc] * G[i];
}

// out[e] = G[e]·linear[e] for the matrices on the linear path.
__global__ void linear_path_kernel(float* out, const float* G, const float* linear, int64_t rc, int64_t n) {
  GRID_STRIDE(i, n) {
    const float l = linear[i / rc];
    if (l != 0.0f) out[i] = G[i] * l;
  }
}

// One quintic step on X [Bt, r, c] (or [Bt, c, r] stored as it is when `tall`), as the CPU's
// quintic_step: A = X·Xᵀ, B = b·A + c·A·A, X_next = a·X + B·X; with bf16 copies (Xb holding bf16(X))
// the GEMMs read the copies and X_next overwrites X, else it goes to Xn.
void quintic_step(std::string_view op, zaya::cuda::DeviceContext& ctx, const Tensor& X, const Tensor& Xn,
                  const Tensor& A, const Tensor& B, const Tensor& Xb, const Tensor& Ab, const Tensor& Bb, bool tall,
                  float a, float b, float c) {
  const bool low = Xb.defined();
  const Tensor& x_in = low ? Xb : X;
  const Trans gram_left = tall ? Trans::T : Trans::N, gram_right = tall ? Trans::N : Trans::T;
  ops::gemm(A, x_in, gram_left, x_in, gram_right);                        // A = X·Xᵀ
  scale_and_round(op, ctx, A, b, B, Ab);                                  // B starts as b·A
  ops::gemm(B, low ? Ab : A, Trans::N, low ? Ab : A, Trans::N, c, 1.0f);  // B = b·A + c·A·A
  if (low) ops::cast_to_bf16(Bb, B);
  const Tensor& b_in = low ? Bb : B;
  const Tensor& out = low ? X : Xn;
  if (!low) scale_and_round(op, ctx, X, a, Xn, {});  // X_next starts as a·X
  if (tall)
    ops::gemm(out, x_in, Trans::N, b_in, Trans::N, 1.0f, low ? a : 1.0f);  // X_next = a·X + X·B
  else
    ops::gemm(out, b_in, Trans::N, x_in, Trans::N, 1.0f, low ? a : 1.0f);  // X_next = a·X + B·X
}

}  // namespace

void newton_schulz_step(const Tensor& X_next, const Tensor& X, const Tensor& A, const Tensor& B, float a, float b,
                        float c) {
  constexpr std::string_view op = "newton_schulz_step";
  auto& ctx = context_for(op);
  const int64_t r = X.size(0);
  quintic_step(op, ctx, X.reshape({1, r, X.size(1)}), X_next.reshape({1, r, X.size(1)}), A.reshape({1, r, r}),
               B.reshape({1, r, r}), {}, {}, {}, false, a, b, c);
}

void newton_schulz_orthogonalize(const Tensor& out, const Tensor& G, const Tensor& workspace, int steps,
                                 DType compute) {
  constexpr std::string_view op = "newton_schulz_orthogonalize";
  auto& ctx = context_for(op);
  const int64_t batch = G.ndim() == 3 ? G.size(0) : 1, rows = G.size(-2), cols = G.size(-1);
  const int64_t rc = rows * cols;
  if (batch == 0 || rc == 0) return;
  const bool tall = rows > cols;
  const int64_t r = std::min(rows, cols), rr = r * r;
  // The workspace as the CPU lays it out (newton_schulz_workspace_elems): A, B, then the next X
  // (f32) or the bf16 copies of X, A and B at the next 64-byte boundary.
  Tensor X = out.reshape({batch, rows, cols});
  Tensor A = workspace.window(0, Shape{batch, r, r});
  Tensor B = workspace.window(batch * rr, Shape{batch, r, r});
  Tensor Y, Xb, Ab, Bb;
  if (compute == DType::f32) {
    Y = workspace.window(2 * batch * rr, Shape{batch, rows, cols});
  } else {
    auto addr = reinterpret_cast<uintptr_t>(workspace.data<float>() + 2 * batch * rr);
    auto* base = reinterpret_cast<bf16*>((addr + 63) & ~uintptr_t{63});
    Xb = Tensor::borrow(base, Shape{batch, rows, cols}, DType::bf16, Device::cuda);
    Ab = Tensor::borrow(base + batch * rc, Shape{batch, r, r}, DType::bf16, Device::cuda);
    Bb = Tensor::borrow(base + batch * (rc + rr), Shape{batch, r, r}, DType::bf16, Device::cuda);
  }

  // Scratch: the norms' block sums, Σ G² per matrix, then X₀'s scale and the linear coefficient.
  const size_t partial_bytes = uniform_sum_squares_scratch_bytes(rc, batch);
  char* s = static_cast<char*>(ctx.scratch(partial_bytes + static_cast<size_t>(batch) * (8 + 2 * 4)));
  auto* sums = reinterpret_cast<double*>(s + partial_bytes);
  auto* scale = reinterpret_cast<float*>(sums + batch);
  float* linear = scale + batch;
  const float* g = G.data<float>();
  uniform_sum_squares(op, g, rc, batch, sums, s);
  const double growth = std::pow(static_cast<double>(kNewtonSchulzA), steps);  // the linear term's a^steps
  coefficients_kernel<<<blocks_for(batch), kThreads, 0, stream_of(ctx)>>>(scale, linear, sums, batch, growth);
  check_launch(op);
  normalize_kernel<<<blocks_for(batch * rc), kThreads, 0, stream_of(ctx)>>>(X.data<float>(), g, scale, rc, batch * rc);
  check_launch(op);

  for (int step = 0; step < steps; ++step) {
    if (Xb.defined()) ops::cast_to_bf16(Xb, X);
    quintic_step(op, ctx, X, Y, A, B, Xb, Ab, Bb, tall, kNewtonSchulzA, kNewtonSchulzB, kNewtonSchulzC);
    if (!Xb.defined()) std::swap(X, Y);
  }
  float* o = out.data<float>();
  if (X.data<float>() != o)  // f32 with an odd step count
    ctx.copy_async(o, Device::cuda, X.data<float>(), Device::cuda, static_cast<size_t>(batch * rc) * sizeof(float));
  linear_path_kernel<<<blocks_for(batch * rc), kThreads, 0, stream_of(ctx)>>>(o, g, linear, rc, batch * rc);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
