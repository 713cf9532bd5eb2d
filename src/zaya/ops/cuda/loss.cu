// CUDA cross-entropy fused with the tied LM head (math and memory argument in ops/loss.h; arguments
// checked by the fronts in ops/loss.cc). The [N, V] logits are made one vocabulary chunk at a time
// by ops::gemm into the workspace, as on the CPU, and this file's kernels do the rest:
//
//   forward, per chunk    logits = h·E[v0:v0+c]ᵀ                        (ops::gemm)
//                         per row: chunk max, the running (max, Σexp) moved to it, Σexp of the
//                         chunk added, the target's logit picked          (row_stats_kernel)
//   forward, at the end   lse = max + log Σ; loss = mean over counted rows (finish_kernel)
//                         [the forward-only ops stop here]
//   backward, per chunk   the chunk's logits again (kept instead when one chunk covers V),
//                         g = (softmax − onehot)/count in place           (grad_kernel)
//                         [bf16 head: g rounded into g16]                 (ops::cast_to_bf16)
//                         dh (+)= g·E[v0:v0+c], dE[v0:v0+c] += gᵀ·h       (ops::gemm)
// The bf16 head runs the same steps with h and E bf16 copies: every GEMM takes bf16 inputs and
// accumulates in f32 (cuBLASLt through ops::gemm); the row kernels are the f32 op's.
//
// Workspace (f32): [N, c] chunk logits, then Σexp [N] and the target logits [N] (the front sizes it
// with the CPU's formula, which is at least this); the running max lives in lse, as on the CPU.
// Deterministic: block reductions in fixed orders, no atomics; the loss is a double sum in a fixed
// order.
#include <climits>
#include <cmath>

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/loss_cuda.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/loss_math.h"

namespace zaya::ops::cuda {
namespace {

// What the forward's end hands back to the host.
struct LossTotals {
  double total;     // Σ (lse − target logit) over counted rows
  long long count;  // counted rows
  int bad_row;      // the first row with a target outside [0, V) that is not the ignore index, or −1
  int bad_target;
};

// Row state before the first chunk: max −inf, Σ 0, target logit 0.
__global__ void init_rows_kernel(float* run_max, float* sum, float* picked, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    run_max[i] = -INFINITY;
    sum[i] = 0.0f;
    picked[i] = 0.0f;
  }
}

// One block per row of a chunk's logits [n, c] (vocabulary columns v0..v0+c): the chunk's max, the
// row's running state raised to it (math::lse_raise_max), then Σ exp(logit − max) added, in two
// passes over the row (the second mostly from L2). The target's logit is picked when it lies in the
// chunk.
__global__ void row_stats_kernel(float* run_max, float* sum, float* picked, const float* logits,
                                 const int32_t* targets, int64_t n, int64_t c, int64_t v0) {
  __shared__ float shared[kThreads / 32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* row = logits + i * c;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += kThreads) m = fmaxf(m, row[j]);
    const float chunk_max = block_max(m, shared);
    float mx = run_max[i], s = sum[i];
    math::lse_raise_max(mx, s, chunk_max);
    float part = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += kThreads) part += expf(row[j] - mx);
    const float total = block_sum(part, shared);  // its barriers order the reads above before the writes
    if (threadIdx.x == 0) {
      run_max[i] = mx;
      sum[i] = s + total;
      const int64_t t = targets[i];
      if (t >= v0 && t < v0 + c) picked[i] = row[t - v0];
    }
  }
}

// One block: lse = max + log Σ for every row, then the loss terms in double, each thread's rows in
// order and the threads' partials in a fixed tree; the count; the first bad target (a min).
__global__ void finish_kernel(LossTotals* out, float* lse, const float* sum, const float* picked,
                              const int32_t* targets, int64_t n, int64_t vocab, int32_t ignore_index) {
  __shared__ double totals[kThreads];
  __shared__ long long counts[kThreads];
  __shared__ int bad[kThreads];
  double total = 0.0;
  long long count = 0;
  int first_bad = INT_MAX;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float l = lse[i] + logf(sum[i]);
    lse[i] = l;
    const int32_t t = targets[i];
    if (t == ignore_index) continue;
    if (t < 0 || t >= vocab) {
      first_bad = min(first_bad, static_cast<int>(i));
      continue;
    }
    total += static_cast<double>(l) - static_cast<double>(picked[i]);
    ++count;
  }
  totals[threadIdx.x] = total;
  counts[threadIdx.x] = count;
  bad[threadIdx.x] = first_bad;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      totals[threadIdx.x] += totals[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
      bad[threadIdx.x] = min(bad[threadIdx.x], bad[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->total = totals[0];
    out->count = counts[0];
    out->bad_row = bad[0] == INT_MAX ? -1 : bad[0];
    out->bad_target = bad[0] == INT_MAX ? 0 : targets[bad[0]];
  }
}

// g = d loss / d logits for a chunk [n, c] in place: (softmax − onehot)/count on counted rows
// (math::xent_logit_grad), 0 on ignored ones. Rows on the grid's y, columns on x: a row's lse and
// target are read once per thread.
__global__ void grad_kernel(float* g, const float* lse, const int32_t* targets, int64_t n, int64_t c,
                            int64_t v0, float inv_count, int32_t ignore_index) {
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int32_t t = targets[i];
    const float l = lse[i];
    float* row = g + i * c;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x)
      row[j] = t == ignore_index ? 0.0f : math::xent_logit_grad(row[j], l, inv_count, v0 + j == t);
  }
}

dim3 grad_grid(int64_t n, int64_t c) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>((c + kThreads - 1) / kThreads, 1, 1024)),
              static_cast<unsigned>(std::clamp<int64_t>(n, 1, 65535)));
}

// The per-row buffers of one call.
struct RowState {
  float* run_max;  // lse's storage until finish
  float* sum;
  float* picked;
};

void init_rows(std::string_view op, zaya::cuda::DeviceContext& ctx, const RowState& st, int64_t n) {
  init_rows_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(st.run_max, st.sum, st.picked, n);
  check_launch(op);
}

void row_stats(std::string_view op, zaya::cuda::DeviceContext& ctx, const RowState& st, const float* logits,
               const int32_t* targets, int64_t n, int64_t c, int64_t v0) {
  row_stats_kernel<<<row_blocks(n), kThreads, 0, stream_of(ctx)>>>(st.run_max, st.sum, st.picked, logits,
                                                                   targets, n, c, v0);
  check_launch(op);
}

// The forward's end: lse finished, the totals (`dev`, device memory) to the host (the one
// synchronization), a bad target thrown with the CPU kernels' message.
CrossEntropyResult finish(std::string_view op, zaya::cuda::DeviceContext& ctx, const RowState& st,
                          LossTotals* dev, const int32_t* targets, int64_t n, int64_t vocab,
                          int32_t ignore_index) {
  finish_kernel<<<1, kThreads, 0, stream_of(ctx)>>>(dev, st.run_max, st.sum, st.picked, targets, n, vocab,
                                                    ignore_index);
  check_launch(op);
  LossTotals host{};
  ctx.copy_async(&host, Device::cpu, dev, Device::cuda, sizeof(host));
  ctx.synchronize();
  ZAYA_CHECK(host.bad_row < 0, op, ": target ", host.bad_target, " at row ", host.bad_row, " is outside [0, ",
             vocab, ") and is not the ignore index ", ignore_index);
  CrossEntropyResult r;
  r.count = host.count;
  r.loss = r.count ? host.total / static_cast<double>(r.count) : 0.0;
  return r;
}

struct TiedDims {
  int64_t n, vocab, chunk;
};

// The forward of the tied head, leaving the last chunk's logits in the workspace.
CrossEntropyResult tied_forward(std::string_view op, zaya::cuda::DeviceContext& ctx, const Tensor& lse,
                                const Tensor& h, const Tensor& E, const Tensor& targets,
                                const Tensor& workspace, const CrossEntropyOptions& opt, const TiedDims& d) {
  float* sum = workspace.data<float>() + d.n * d.chunk;
  const RowState st{lse.data<float>(), sum, sum + d.n};
  init_rows(op, ctx, st, d.n);
  for (int64_t v0 = 0; v0 < d.vocab; v0 += d.chunk) {
    const int64_t c = std::min(d.chunk, d.vocab - v0);
    Tensor logits = workspace.window(0, Shape{d.n, c});
    ops::gemm(logits, h, Trans::N, E.slice(v0, v0 + c), Trans::T, 1.0f, 0.0f);
    row_stats(op, ctx, st, logits.data<float>(), targets.data<int32_t>(), d.n, c, v0);
  }
  // The totals in the context's scratch, taken only now: ops::gemm may use the scratch itself.
  auto* totals = static_cast<LossTotals*>(ctx.scratch(sizeof(LossTotals)));
  return finish(op, ctx, st, totals, targets.data<int32_t>(), d.n, d.vocab, opt.ignore_index);
}

TiedDims tied_dims(const Tensor& h, const Tensor& E, const CrossEntropyOptions& opt) {
  return {h.size(0), E.size(0), std::min(opt.chunk, E.size(0))};
}

}  // namespace

CrossEntropyResult cross_entropy_tied_forward(const Tensor& lse, const Tensor& h, const Tensor& E,
                                              const Tensor& targets, const Tensor& workspace,
                                              const CrossEntropyOptions& opt) {
  constexpr std::string_view op = "cross_entropy_tied_forward";
  auto& ctx = context_for(op);
  return tied_forward(op, ctx, lse, h, E, targets, workspace, opt, tied_dims(h, E, opt));
}

namespace {

// The tied head's forward and backward, with f32 GEMM operands (g16 undefined) or bf16 ones (h, E
// bf16; each chunk's gradient rounded into g16 for the two backward GEMMs).
// d loss / d logit[n, v] = (softmax[n, v] − [v == t_n]) / count for counted rows, 0 for ignored:
// dh = G·E chunk by chunk (the first chunk writes), dE += Gᵀ·h.
CrossEntropyResult tied_forward_backward(std::string_view op, const Tensor& dh, const Tensor& dE,
                                         const Tensor& lse, const Tensor& h, const Tensor& E,
                                         const Tensor& targets, const Tensor& workspace, const Tensor& g16,
                                         const CrossEntropyOptions& opt) {
  auto& ctx = context_for(op);
  const TiedDims d = tied_dims(h, E, opt);
  const CrossEntropyResult r = tied_forward(op, ctx, lse, h, E, targets, workspace, opt, d);
  if (r.count == 0) {  // nothing to learn from: zero dh, leave dE alone, no 0/0
    const cudaError_t err = cudaMemsetAsync(dh.data<float>(), 0, dh.nbytes(), stream_of(ctx));
    ZAYA_CHECK(err == cudaSuccess, "ops::", op, ": zeroing dh failed: ", cudaGetErrorString(err));
    return r;
  }
  const float inv_count = 1.0f / static_cast<float>(r.count);
  // One chunk covering V: the forward's logits are still in the workspace (nothing wrote it since).
  const bool kept = d.chunk == d.vocab;
  for (int64_t v0 = 0; v0 < d.vocab; v0 += d.chunk) {
    const int64_t c = std::min(d.chunk, d.vocab - v0);
    Tensor g = workspace.window(0, Shape{d.n, c});
    Tensor e_chunk = E.slice(v0, v0 + c);
    if (!kept) ops::gemm(g, h, Trans::N, e_chunk, Trans::T, 1.0f, 0.0f);
    grad_kernel<<<grad_grid(d.n, c), kThreads, 0, stream_of(ctx)>>>(
        g.data<float>(), lse.data<float>(), targets.data<int32_t>(), d.n, c, v0, inv_count, opt.ignore_index);
    check_launch(op);
    if (g16.defined()) {
      const Tensor g_bf16 = g16.window(0, Shape{d.n, c});
      ops::cast_to_bf16(g_bf16, g);
      g = g_bf16;
    }
    ops::gemm(dh, g, Trans::N, e_chunk, Trans::N, 1.0f, v0 == 0 ? 0.0f : 1.0f);
    ops::gemm(dE.slice(v0, v0 + c), g, Trans::T, h, Trans::N, 1.0f, 1.0f);
  }
  return r;
}

}  // namespace

CrossEntropyResult cross_entropy_tied_forward_backward(const Tensor& dh, const Tensor& dE, const Tensor& lse,
                                                       const Tensor& h, const Tensor& E,
                                                       const Tensor& targets, const Tensor& workspace,
                                                       const CrossEntropyOptions& opt) {
  return tied_forward_backward("cross_entropy_tied_forward_backward", dh, dE, lse, h, E, targets, workspace,
                               Tensor{}, opt);
}

CrossEntropyResult cross_entropy_tied_forward_backward_bf16(const Tensor& dh, const Tensor& dE,
                                                            const Tensor& lse, const Tensor& h16,
                                                            const Tensor& E16, const Tensor& targets,
                                                            const Tensor& workspace, const Tensor& g16,
                                                            const CrossEntropyOptions& opt) {
  return tied_forward_backward("cross_entropy_tied_forward_backward_bf16", dh, dE, lse, h16, E16, targets,
                               workspace, g16, opt);
}

// The bf16 head's forward is tied_forward on bf16 h16 and E16, as in its forward-backward (ops::gemm
// takes either dtype): the same loss and lse bit for bit.
CrossEntropyResult cross_entropy_tied_forward_bf16(const Tensor& lse, const Tensor& h16, const Tensor& E16,
                                                   const Tensor& targets, const Tensor& workspace,
                                                   const CrossEntropyOptions& opt) {
  constexpr std::string_view op = "cross_entropy_tied_forward_bf16";
  auto& ctx = context_for(op);
  return tied_forward(op, ctx, lse, h16, E16, targets, workspace, opt, tied_dims(h16, E16, opt));
}

CrossEntropyResult cross_entropy_logits_forward(const Tensor& lse, const Tensor& logits,
                                                const Tensor& targets, int32_t ignore_index) {
  constexpr std::string_view op = "cross_entropy_logits_forward";
  auto& ctx = context_for(op);
  const int64_t n = logits.size(0), vocab = logits.size(1);
  // The totals, then Σ and the target logits, in the context's scratch (only this op's kernels run
  // until finish has read it).
  constexpr int64_t kTotalsFloats = 8;
  static_assert(sizeof(LossTotals) <= kTotalsFloats * sizeof(float));
  auto* scratch =
      static_cast<float*>(ctx.scratch(static_cast<size_t>(kTotalsFloats + 2 * n) * sizeof(float)));
  const RowState st{lse.data<float>(), scratch + kTotalsFloats, scratch + kTotalsFloats + n};
  init_rows(op, ctx, st, n);
  row_stats(op, ctx, st, logits.data<float>(), targets.data<int32_t>(), n, vocab, 0);
  return finish(op, ctx, st, reinterpret_cast<LossTotals*>(scratch), targets.data<int32_t>(), n, vocab,
                ignore_index);
}

void cross_entropy_logits_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                   int64_t count, int32_t ignore_index) {
  constexpr std::string_view op = "cross_entropy_logits_backward";
  auto& ctx = context_for(op);
  const int64_t n = logits.size(0), vocab = logits.size(1);
  grad_kernel<<<grad_grid(n, vocab), kThreads, 0, stream_of(ctx)>>>(
      logits.data<float>(), lse.data<float>(), targets.data<int32_t>(), n, vocab, 0,
      1.0f / static_cast<float>(count), ignore_index);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
