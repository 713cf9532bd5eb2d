// CUDA optimizer primitives (optim_cuda.h): the gradient norm in the CPU's exact order, the scaling
// and the AdamW step through the per-element function the CPU runs (optim_math.h).
#include <cstdint>
#include <vector>

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/optim_cuda.h"
#include "zaya/ops/optim_math.h"

namespace zaya::ops::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

using math::kNormBlock;
using math::kNormLanes;

__host__ __device__ int64_t blocks_of(int64_t n) { return (n + kNormBlock - 1) / kNormBlock; }

// ---------------------------------------------------------------------------------------------
// Σ x² in double, in global_grad_norm's order (optim_math.h): one group of 16 threads per
// 16 Ki-element block, thread l adding the elements ≡ l mod 16 in order (x² of a float is exact in
// double, so the FMA nvcc makes of s + x·x rounds as the CPU's add does); the group's lanes then
// combine in the CPU's order through shuffles. Then one thread per tensor adds its blocks in order.

// Where a tensor's blocks are: a list of tensors (global_grad_norm) or equal consecutive matrices
// (Newton–Schulz's batch).
struct TensorSpan {
  const float* x;
  int64_t n;
  int64_t first_block;  // its blocks' index in the call's partial sums
};
struct Listed {
  const TensorSpan* spans;
  int64_t count;
  // The tensor holding global block `blk`: the last span whose first_block <= blk.
  __device__ TensorSpan find(int64_t blk) const {
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (spans[mid].first_block <= blk) lo = mid; else hi = mid - 1;
    }
    return spans[lo];
  }
  __device__ TensorSpan at(int64_t t) const { return spans[t]; }
};
struct Uniform {
  const float* base;
  int64_t n, blocks_per;
  __device__ TensorSpan find(int64_t blk) const { return at(blk / blocks_per); }
  __device__ TensorSpan at(int64_t t) const { return {base + t * n, n, t * blocks_per}; }
};

template <class Where>
__global__ void block_sum_squares_kernel(double* partial, Where where, int64_t total_blocks) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t blk = tid / kNormLanes;
  const int lane = static_cast<int>(tid % kNormLanes);
  double s = 0.0;
  if (blk < total_blocks) {
    const TensorSpan t = where.find(blk);
    const int64_t i0 = (blk - t.first_block) * kNormBlock;
    const int64_t len = min(kNormBlock, t.n - i0);
    const float* x = t.x + i0;
    for (int64_t j = lane; j < len; j += kNormLanes) {
      const double v = static_cast<double>(x[j]);
      s += v * v;
    }
  }
  // Every thread of the warp takes part in the shuffles (groups of 16 lanes: width 16).
  s += __shfl_down_sync(0xffffffffu, s, 8, kNormLanes);  // lane[l] += lane[l + 8], l < 8
  s += __shfl_down_sync(0xffffffffu, s, 4, kNormLanes);  // lane[l] += lane[l + 4], l < 4
  s += __shfl_down_sync(0xffffffffu, s, 2, kNormLanes);  // lane0 + lane2, lane1 + lane3
  s += __shfl_down_sync(0xffffffffu, s, 1, kNormLanes);  // (lane0 + lane2) + (lane1 + lane3)
  if (blk < total_blocks && lane == 0) partial[blk] = s;
}

// sums[t] = Σ of tensor t's block sums in block order (0 + the one block where it has one).
template <class Where>
__global__ void tensor_sums_kernel(double* sums, const double* partial, Where where, int64_t count) {
  GRID_STRIDE(t, count) {
    const TensorSpan s = where.at(t);
    double total = 0.0;
    for (int64_t b = 0, nb = blocks_of(s.n); b < nb; ++b) total += partial[s.first_block + b];
    sums[t] = total;
  }
}

__global__ void total_kernel(double* total, const double* sums, int64_t count) {
  double s = 0.0;
  for (int64_t t = 0; t < count; ++t) s += sums[t];
  *total = s;
}

template <class Where>
void sum_squares(std::string_view op, zaya::cuda::DeviceContext& ctx, Where where, int64_t count,
                 int64_t total_blocks, double* partial, double* sums) {
  if (total_blocks > 0) {
    const int64_t threads = total_blocks * kNormLanes;
    block_sum_squares_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0,
                               stream_of(ctx)>>>(partial, where, total_blocks);
    check_launch(op);
  }
  tensor_sums_kernel<<<blocks_for(count), kThreads, 0, stream_of(ctx)>>>(sums, partial, where, count);
  check_launch(op);
}

// ---------------------------------------------------------------------------------------------

__global__ void scale_kernel(float* p, int64_t n, float s) {
  GRID_STRIDE(i, n) p[i] *= s;
}

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n, math::AdamWConsts k) {
  GRID_STRIDE(i, n) math::adamw_step(p[i], g[i], m[i], v[i], k);
}

size_t align8(size_t bytes) { return (bytes + 7) / 8 * 8; }

}  // namespace

double global_grad_norm(std::span<const Tensor> grads) {
  constexpr std::string_view op = "global_grad_norm";
  auto& ctx = context_for(op);
  const int64_t count = static_cast<int64_t>(grads.size());
  if (count == 0) return 0.0;
  std::vector<TensorSpan> spans(grads.size());
  int64_t total_blocks = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    spans[i] = {grads[i].data<float>(), grads[i].numel(), total_blocks};
    total_blocks += blocks_of(grads[i].numel());
  }
  // Scratch: the spans, the block sums, the tensor sums and the total.
  const size_t span_bytes = align8(spans.size() * sizeof(TensorSpan));
  char* base = static_cast<char*>(ctx.scratch(span_bytes + static_cast<size_t>(total_blocks + count + 1) * 8));
  auto* dev_spans = reinterpret_cast<TensorSpan*>(base);
  auto* partial = reinterpret_cast<double*>(base + span_bytes);
  double* sums = partial + total_blocks;
  double* total = sums + count;
  // From pageable memory: the copy has taken the host's bytes when it returns.
  ctx.copy_async(dev_spans, Device::cuda, spans.data(), Device::cpu, spans.size() * sizeof(TensorSpan));
  sum_squares(op, ctx, Listed{dev_spans, count}, count, total_blocks, partial, sums);
  total_kernel<<<1, 1, 0, stream_of(ctx)>>>(total, sums, count);
  check_launch(op);
  double host_total = 0.0;
  ctx.copy_async(&host_total, Device::cpu, total, Device::cuda, sizeof host_total);
  ctx.synchronize();
  return std::sqrt(host_total);
}

size_t uniform_sum_squares_scratch_bytes(int64_t n, int64_t count) {
  return static_cast<size_t>(count * blocks_of(n)) * sizeof(double);
}

void uniform_sum_squares(std::string_view op, const float* base, int64_t n, int64_t count, double* sums,
                         void* scratch) {
  auto& ctx = context_for(op);
  if (count == 0) return;
  sum_squares(op, ctx, Uniform{base, n, blocks_of(n)}, count, count * blocks_of(n), static_cast<double*>(scratch),
              sums);
}

void scale_inplace(const Tensor& t, float s) {
  constexpr std::string_view op = "scale_inplace";
  auto& ctx = context_for(op);
  if (t.numel() == 0) return;
  scale_kernel<<<blocks_for(t.numel()), kThreads, 0, stream_of(ctx)>>>(t.data<float>(), t.numel(), s);
  check_launch(op);
}

void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad, const AdamWHyper& hp,
                  int64_t step) {
  constexpr std::string_view op = "adamw_update";
  auto& ctx = context_for(op);
  const int64_t n = param.numel();
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(param.data<float>(), m.data<float>(), v.data<float>(),
                                                               grad.data<float>(), n, math::adamw_consts(hp, step));
  check_launch(op);
}

namespace {
// Muon's element passes (optim_math.h), the CPU's per-element functions.
__global__ void muon_momentum_kernel(float* g, float* m, int64_t n, float beta) {
  GRID_STRIDE(i, n) math::muon_momentum_step(g[i], m[i], beta);
}

__global__ void muon_apply_kernel(float* p, const float* o, int64_t n, float lr, float wd, float s) {
  GRID_STRIDE(i, n) math::muon_apply_step(p[i], o[i], lr, wd, s);
}
}  // namespace

void muon_momentum(const Tensor& grad, const Tensor& m, float beta) {
  constexpr std::string_view op = "muon_momentum";
  auto& ctx = context_for(op);
  const int64_t n = grad.numel();
  if (n == 0) return;
  muon_momentum_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(grad.data<float>(), m.data<float>(), n, beta);
  check_launch(op);
}

void muon_apply(const Tensor& param, const Tensor& update, float lr, float weight_decay, float scale) {
  constexpr std::string_view op = "muon_apply";
  auto& ctx = context_for(op);
  const int64_t n = param.numel();
  if (n == 0) return;
  muon_apply_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(param.data<float>(), update.data<float>(), n, lr,
                                                                     weight_decay, scale);
  check_launch(op);
}

}  // namespace zaya::ops::cuda
