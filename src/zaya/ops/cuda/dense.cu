// CUDA kernels for dense.h's per-token ops (arguments checked by the fronts in ops/dense.cc):
// forward and backward side by side, the math written out as in cpu/dense_cpu.cc. fp32 tensors,
// except the bf16 embedding table, SwiGLU's backward's bf16 gu, the residual scaling backward's bf16 h
// and the two casts.
//
// Elementwise ops are grid-stride loops over the elements; row ops (RMSNorm, softmax) give each row
// one block of kThreads threads and reduce with block_sum/block_max; parameter gradients are column
// sums in fixed chunk order (launch.cuh). Nothing here uses atomics, so every result is bitwise the
// same run to run.
#include "zaya/ops/cuda/dense_cuda.h"

#include <cmath>

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/elementwise_math.h"

namespace zaya::ops::cuda {
namespace {

int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(-1); }
int64_t rows_of(const Tensor& t) {
  const int64_t f = last_dim(t);
  return f == 0 ? 0 : t.numel() / f;
}

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

}  // namespace

// ---------------------------------------------------------------------------------------------
// embedding: y[n] = E[ids[n]].  dE[ids[n]] += dy[n] unless ids[n] == padding_idx.

namespace {
// A table (or saved activation) element as f32: itself, or a bf16 one widened (exact).
__device__ inline float table_value(float e) { return e; }
__device__ inline float table_value(bf16 e) { return to_float(e); }

template <class T>
__global__ void embedding_forward_kernel(float* y, const int32_t* ids, const T* E, int64_t n, int64_t vocab,
                                         int64_t h) {
  GRID_STRIDE(k, n * h) {
    const int64_t i = k / h, j = k % h;
    const int64_t id = ids[i];
    y[k] = (id >= 0 && id < vocab) ? table_value(E[id * h + j]) : NAN;
  }
}

// One thread per column j walks the tokens in order, so repeated ids add up in token order (as on
// the CPU, where threads own column blocks): deterministic, with H-way parallelism.
__global__ void embedding_backward_kernel(float* dE, const float* dy, const int32_t* ids, int64_t n, int64_t vocab,
                                          int64_t h, int64_t padding_idx) {
  GRID_STRIDE(j, h) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[i];
      if (id == padding_idx || id < 0 || id >= vocab) continue;
      dE[id * h + j] += dy[i * h + j];
    }
  }
}
}  // namespace

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& E) {
  constexpr std::string_view op = "embedding_forward";
  auto& ctx = context_for(op);
  const int64_t n = ids.numel(), vocab = E.size(0), h = E.size(1);
  if (n * h == 0) return;
  if (E.dtype() == DType::bf16)
    embedding_forward_kernel<<<blocks_for(n * h), kThreads, 0, stream_of(ctx)>>>(
        y.data<float>(), ids.data<int32_t>(), E.data<bf16>(), n, vocab, h);
  else
    embedding_forward_kernel<<<blocks_for(n * h), kThreads, 0, stream_of(ctx)>>>(
        y.data<float>(), ids.data<int32_t>(), E.data<float>(), n, vocab, h);
  check_launch(op);
}

void embedding_backward(const Tensor& dE, const Tensor& dy, const Tensor& ids, int64_t padding_idx) {
  constexpr std::string_view op = "embedding_backward";
  auto& ctx = context_for(op);
  const int64_t n = ids.numel(), vocab = dE.size(0), h = dE.size(1);
  if (n * h == 0) return;
  embedding_backward_kernel<<<blocks_for(h), kThreads, 0, stream_of(ctx)>>>(
      dE.data<float>(), dy.data<float>(), ids.data<int32_t>(), n, vocab, h, padding_idx);
  check_launch(op);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm: r = 1/sqrt(mean(x²) + eps), x̂ = x·r, y = w ⊙ x̂  (fp32 statistics).
// backward: with ĝ = dy ⊙ w, dx = r·(ĝ − x̂·mean(ĝ ⊙ x̂)),  dw += Σ_rows dy ⊙ x̂.

namespace {
__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t f,
                                       float eps) {
  __shared__ float shared[kThreads / 32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* xi = x + i * f;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < f; j += kThreads) ss += xi[j] * xi[j];
    const float r = 1.0f / sqrtf(block_sum(ss, shared) / static_cast<float>(f) + eps);
    if (threadIdx.x == 0) rstd[i] = r;
    for (int64_t j = threadIdx.x; j < f; j += kThreads) y[i * f + j] = w[j] * (xi[j] * r);
  }
}

// mean(ĝ ⊙ x̂) = r·mean(dy ⊙ w ⊙ x); dx written, or added with `accumulate`.
__global__ void rmsnorm_backward_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                           const float* rstd, int64_t n, int64_t f, bool accumulate) {
  __shared__ float shared[kThreads / 32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* gi = dy + i * f;
    const float* xi = x + i * f;
    const float r = rstd[i];
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < f; j += kThreads) s += gi[j] * w[j] * xi[j];
    const float mean_gx = block_sum(s, shared) * r / static_cast<float>(f);
    for (int64_t j = threadIdx.x; j < f; j += kThreads) {
      const float d = r * (gi[j] * w[j] - xi[j] * r * mean_gx);
      dx[i * f + j] = accumulate ? dx[i * f + j] + d : d;
    }
  }
}

struct RmsnormDwTerm {  // dy ⊙ x̂
  const float *dy, *x, *rstd;
  int64_t f;
  __device__ float operator()(int64_t i, int64_t j) const { return dy[i * f + j] * (x[i * f + j] * rstd[i]); }
};
struct AddTo {  // out[j] += total
  float* out;
  __device__ void operator()(int64_t j, float total) const { out[j] += total; }
};
}  // namespace

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  auto& ctx = context_for(op);
  const int64_t f = last_dim(x), n = rows_of(x);
  if (n == 0) return;
  rmsnorm_forward_kernel<<<row_blocks(n), kThreads, 0, stream_of(ctx)>>>(y.data<float>(), rstd.data<float>(),
                                                                          x.data<float>(), w.data<float>(), n, f, eps);
  check_launch(op);
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, bool accumulate_dx) {
  constexpr std::string_view op = "rmsnorm_backward";
  auto& ctx = context_for(op);
  const int64_t f = last_dim(x), n = rows_of(x);
  if (n == 0) return;
  if (dx.defined()) {
    rmsnorm_backward_dx_kernel<<<row_blocks(n), kThreads, 0, stream_of(ctx)>>>(
        dx.data<float>(), dy.data<float>(), x.data<float>(), w.data<float>(), rstd.data<float>(), n, f, accumulate_dx);
    check_launch(op);
  }
  if (dw.defined())
    column_sums(op, ctx, n, f, RmsnormDwTerm{dy.data<float>(), x.data<float>(), rstd.data<float>(), f},
                AddTo{dw.data<float>()});
}

// ---------------------------------------------------------------------------------------------
// residual scaling: y = (h + b_h) ⊙ s_h + (x + b_x) ⊙ s_x.
// backward: dh = dy ⊙ s_h, dx = dy ⊙ s_x, ds_h += Σ dy ⊙ (h + b_h), db_h += s_h·Σ dy,
//           ds_x += Σ dy ⊙ (x + b_x), db_x += s_x·Σ dy.

namespace {
struct ResidualPtrs {
  const float *sh, *bh, *sx, *bx;
};
ResidualPtrs ptrs(const ResidualScaleParams& p) {
  return {p.hidden_scale.data<float>(), p.hidden_bias.data<float>(), p.residual_scale.data<float>(),
          p.residual_bias.data<float>()};
}

__global__ void residual_scale_forward_kernel(float* y, const float* h, const float* x, ResidualPtrs p, int64_t n,
                                              int64_t f) {
  GRID_STRIDE(k, n * f) {
    const int64_t j = k % f;
    y[k] = (h[k] + p.bh[j]) * p.sh[j] + (x[k] + p.bx[j]) * p.sx[j];
  }
}

__global__ void residual_scale_backward_kernel(float* dh, float* dx, const float* dy, ResidualPtrs p, int64_t n,
                                               int64_t f) {
  GRID_STRIDE(k, n * f) {
    const int64_t j = k % f;
    if (dh) dh[k] = dy[k] * p.sh[j];
    if (dx) dx[k] = dy[k] * p.sx[j];
  }
}

// Columns [0, f): dy ⊙ (h + b_h); [f, 2f): dy ⊙ (x + b_x); [2f, 3f): dy. HT is h's element type:
// f32, or a bf16 saved copy read widened (exact), so that the sums are bitwise those over the
// widened h.
template <class HT>
struct ResidualTerm {
  const float* dy;
  const HT* h;
  const float* x;
  ResidualPtrs p;
  int64_t f;
  __device__ float operator()(int64_t i, int64_t c) const {
    if (c < f) return dy[i * f + c] * (table_value(h[i * f + c]) + p.bh[c]);
    if (c < 2 * f) return dy[i * f + c - f] * (x[i * f + c - f] + p.bx[c - f]);
    return dy[i * f + c - 2 * f];
  }
};
struct ResidualFinish {
  float *dsh, *dsx, *dbh, *dbx;
  ResidualPtrs p;
  int64_t f;
  __device__ void operator()(int64_t c, float total) const {
    if (c < f) {
      dsh[c] += total;
    } else if (c < 2 * f) {
      dsx[c - f] += total;
    } else {
      dbh[c - 2 * f] += total * p.sh[c - 2 * f];  // Σ dy ⊙ s_h = s_h · Σ dy, as on the CPU
      dbx[c - 2 * f] += total * p.sx[c - 2 * f];
    }
  }
};
}  // namespace

void residual_scale_forward(const Tensor& y, const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  constexpr std::string_view op = "residual_scale_forward";
  auto& ctx = context_for(op);
  const int64_t f = last_dim(h), n = rows_of(h);
  if (n * f == 0) return;
  residual_scale_forward_kernel<<<blocks_for(n * f), kThreads, 0, stream_of(ctx)>>>(
      y.data<float>(), h.data<float>(), x.data<float>(), ptrs(p), n, f);
  check_launch(op);
}

void residual_scale_backward(const Tensor& dh, const Tensor& dx, const ResidualScaleParams& grads, const Tensor& dy,
                             const Tensor& h, const Tensor& x, const ResidualScaleParams& p) {
  constexpr std::string_view op = "residual_scale_backward";
  auto& ctx = context_for(op);
  const int64_t f = last_dim(h), n = rows_of(h);
  if (f == 0) return;
  if ((dh.defined() || dx.defined()) && n > 0) {
    residual_scale_backward_kernel<<<blocks_for(n * f), kThreads, 0, stream_of(ctx)>>>(
        dh.defined() ? dh.data<float>() : nullptr, dx.defined() ? dx.data<float>() : nullptr, dy.data<float>(), ptrs(p),
        n, f);
    check_launch(op);
  }
  const ResidualFinish finish{grads.hidden_scale.data<float>(), grads.residual_scale.data<float>(),
                              grads.hidden_bias.data<float>(), grads.residual_bias.data<float>(), ptrs(p), f};
  if (h.dtype() == DType::bf16)
    column_sums(op, ctx, n, 3 * f, ResidualTerm<bf16>{dy.data<float>(), h.data<bf16>(), x.data<float>(), ptrs(p), f},
                finish);
  else
    column_sums(op, ctx, n, 3 * f, ResidualTerm<float>{dy.data<float>(), h.data<float>(), x.data<float>(), ptrs(p), f},
                finish);
}

// ---------------------------------------------------------------------------------------------
// activations: the per-element math is in elementwise_math.h (shared with the CPU tests).
// silu(x) = x·σ(x); gelu(x) = ½x(1 + erf(x/√2)); swiglu(g, v) = silu(g)·v on gu = [g | v].

namespace {
__global__ void silu_forward_kernel(float* y, const float* x, int64_t n) {
  GRID_STRIDE(i, n) y[i] = math::silu(x[i]);
}
__global__ void silu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = dy[i] * math::silu_grad(x[i]);
}
__global__ void gelu_forward_kernel(float* y, const float* x, int64_t n) {
  GRID_STRIDE(i, n) y[i] = math::gelu(x[i]);
}
__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = dy[i] * math::gelu_grad(x[i]);
}

__global__ void swiglu_forward_kernel(float* y, const float* gu, int64_t n, int64_t inter) {
  GRID_STRIDE(k, n * inter) {
    const int64_t i = k / inter, j = k % inter;
    const float* g = gu + i * 2 * inter;
    y[k] = math::swiglu(g[j], g[inter + j]);
  }
}
// gu f32, or bf16 (the saved copy of bf16 activations) widened exactly: the f32 kernel's bits on
// the widened values.
template <class T>
__global__ void swiglu_backward_kernel(float* dgu, const float* dy, const T* gu, int64_t n, int64_t inter) {
  GRID_STRIDE(k, n * inter) {
    const int64_t i = k / inter, j = k % inter;
    const T* g = gu + i * 2 * inter;
    const math::SwigluGrad d = math::swiglu_grad(dy[k], table_value(g[j]), table_value(g[inter + j]));
    dgu[i * 2 * inter + j] = d.dg;
    dgu[i * 2 * inter + inter + j] = d.dv;
  }
}

__global__ void cast_to_bf16_kernel(bf16* dst, const float* src, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = to_bf16(src[i]);  // core's rounding: bitwise the CPU's
}

__global__ void cast_to_f32_kernel(float* dst, const bf16* src, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = to_float(src[i]);  // core's widening, a bit shift: bitwise the CPU's
}

template <class Kernel, class... Args>
void elementwise(std::string_view op, int64_t n, Kernel kernel, Args... args) {
  auto& ctx = context_for(op);
  if (n == 0) return;
  kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(args..., n);
  check_launch(op);
}
}  // namespace

void silu_forward(const Tensor& y, const Tensor& x) {
  elementwise("silu_forward", x.numel(), silu_forward_kernel, y.data<float>(), x.data<float>());
}
void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  elementwise("silu_backward", x.numel(), silu_backward_kernel, dx.data<float>(), dy.data<float>(), x.data<float>());
}
void gelu_forward(const Tensor& y, const Tensor& x) {
  elementwise("gelu_forward", x.numel(), gelu_forward_kernel, y.data<float>(), x.data<float>());
}
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  elementwise("gelu_backward", x.numel(), gelu_backward_kernel, dx.data<float>(), dy.data<float>(), x.data<float>());
}

void swiglu_forward(const Tensor& y, const Tensor& gu) {
  constexpr std::string_view op = "swiglu_forward";
  auto& ctx = context_for(op);
  const int64_t n = gu.size(0), inter = gu.size(1) / 2;
  if (n * inter == 0) return;
  swiglu_forward_kernel<<<blocks_for(n * inter), kThreads, 0, stream_of(ctx)>>>(y.data<float>(), gu.data<float>(), n,
                                                                                 inter);
  check_launch(op);
}
void swiglu_backward(const Tensor& dgu, const Tensor& dy, const Tensor& gu) {
  constexpr std::string_view op = "swiglu_backward";
  auto& ctx = context_for(op);
  const int64_t n = gu.size(0), inter = gu.size(1) / 2;
  if (n * inter == 0) return;
  if (gu.dtype() == DType::bf16)
    swiglu_backward_kernel<<<blocks_for(n * inter), kThreads, 0, stream_of(ctx)>>>(
        dgu.data<float>(), dy.data<float>(), gu.data<bf16>(), n, inter);
  else
    swiglu_backward_kernel<<<blocks_for(n * inter), kThreads, 0, stream_of(ctx)>>>(
        dgu.data<float>(), dy.data<float>(), gu.data<float>(), n, inter);
  check_launch(op);
}

void cast_to_bf16(const Tensor& dst, const Tensor& src) {
  elementwise("cast_to_bf16", src.numel(), cast_to_bf16_kernel, dst.data<bf16>(), src.data<float>());
}
void cast_to_f32(const Tensor& dst, const Tensor& src) {
  elementwise("cast_to_f32", src.numel(), cast_to_f32_kernel, dst.data<float>(), src.data<bf16>());
}

// ---------------------------------------------------------------------------------------------
// softmax over the last dim: y = exp(x − max) / Σ exp(x − max).  dx = y ⊙ (dy − Σ dy ⊙ y).

namespace {
__global__ void softmax_forward_kernel(float* y, const float* x, int64_t n, int64_t f) {
  __shared__ float shared[kThreads / 32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* xi = x + i * f;
    float* yi = y + i * f;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < f; j += kThreads) m = fmaxf(m, xi[j]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < f; j += kThreads) {
      const float e = expf(xi[j] - m);
      yi[j] = e;
      s += e;
    }
    const float inv = 1.0f / block_sum(s, shared);
    for (int64_t j = threadIdx.x; j < f; j += kThreads) yi[j] *= inv;  // each thread rescales its own exps
  }
}

// In place (dx == dy) is safe: every thread has read its dy terms before block_sum returns.
__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y, int64_t n, int64_t f) {
  __shared__ float shared[kThreads / 32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < f; j += kThreads) s += dy[i * f + j] * y[i * f + j];
    s = block_sum(s, shared);
    for (int64_t j = threadIdx.x; j < f; j += kThreads) dx[i * f + j] = y[i * f + j] * (dy[i * f + j] - s);
  }
}
}  // namespace

void softmax_forward(const Tensor& y, const Tensor& x) {
  constexpr std::string_view op = "softmax_forward";
  auto& ctx = context_for(op);
  const int64_t f = last_dim(x), n = rows_of(x);
  if (n == 0) return;
  softmax_forward_kernel<<<row_blocks(n), kThreads, 0, stream_of(ctx)>>>(y.data<float>(), x.data<float>(), n, f);
  check_launch(op);
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  constexpr std::string_view op = "softmax_backward";
  auto& ctx = context_for(op);
  const int64_t f = last_dim(y), n = rows_of(y);
  if (n == 0) return;
  softmax_backward_kernel<<<row_blocks(n), kThreads, 0, stream_of(ctx)>>>(dx.data<float>(), dy.data<float>(),
                                                                           y.data<float>(), n, f);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
