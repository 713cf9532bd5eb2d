// CUDA kernels for MoE routing and the token permutation (math in ops/moe.h; arguments checked by
// the fronts in ops/moe.cc), forward and backward side by side. fp32 activations, i32 indices.
//
//   route       p = softmax(z) over E+1 classes, c = argmax_e (p_e + β_e), w = p_c (0 for skip)
//   route bwd   dz_e = dw·p_c·(δ_ce − p_e), 0 for skipped tokens
//   plan        counts, offsets, pos, src: a stable counting sort of the tokens by expert
//   gather      xp[r] = x[src[r]]                bwd  dx[n] = dxp[pos[n]] (0 if skipped)
//   unpermute   out[n] = w[n]·y[pos[n]]          bwd  dy[pos[n]] = w[n]·dout[n], dw[n] = ⟨dout[n], y[pos[n]]⟩
//
// Exactness: the router runs ops/router_math.h's row functions, the CPU kernel's own code; the plan
// ranks each token among the earlier tokens of its expert (warp match + a scan over warps in order,
// no order-dependent atomics), so pos/src equal the CPU's serial counting sort. The permutation
// kernels are copies and single products, bitwise the CPU's; only ⟨dout, y⟩ is a sum in another
// order (a warp's fixed butterfly). The unpermute's backward also takes y in bf16 (widened as read).
#include "zaya/ops/cuda/moe_cuda.h"

#include <climits>

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/router_math.h"

namespace zaya::ops::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---------------------------------------------------------------------------------------------
// route: one thread per token row. A block's rows are staged in shared memory with coalesced loads
// and stores (K floats per row, K = E + 1 is odd for an even E: no bank conflicts), and each thread
// runs the shared row function on its row there, in place.

constexpr int kRouteRows = 64;             // rows (and threads) per block
constexpr int64_t kRouteStagedMaxK = 192;  // 64 rows × 192 floats = 48 KiB of shared memory

__global__ void moe_route_kernel(float* probs, int32_t* choice, float* weight, const float* logits,
                                 const float* beta, int64_t N, int64_t K, bool staged) {
  extern __shared__ float tile[];  // [kRouteRows][K] when staged
  const int64_t n0 = blockIdx.x * static_cast<int64_t>(kRouteRows);
  const int64_t rows = min(static_cast<int64_t>(kRouteRows), N - n0);
  if (staged) {
    for (int64_t i = threadIdx.x; i < rows * K; i += blockDim.x) tile[i] = logits[n0 * K + i];
    __syncthreads();
  }
  if (threadIdx.x < rows) {
    const int64_t n = n0 + threadIdx.x;
    float* p = staged ? tile + threadIdx.x * K : probs + n * K;
    const float* z = staged ? p : logits + n * K;
    const int32_t best = math::route_row(p, z, beta, K);
    choice[n] = best;
    weight[n] = best == K - 1 ? 0.0f : p[best];
  }
  if (staged) {
    __syncthreads();
    for (int64_t i = threadIdx.x; i < rows * K; i += blockDim.x) probs[n0 * K + i] = tile[i];
  }
}

// One thread per element of dlogits: coalesced, and the per-element formula is the CPU's.
__global__ void moe_route_backward_kernel(float* dlogits, const float* dweight, const float* probs,
                                          const int32_t* choice, int64_t N, int64_t K) {
  GRID_STRIDE(k, N * K) {
    const int64_t n = k / K, e = k % K;
    const int32_t c = choice[n];
    if (c == K - 1) {  // skip: the weight is the constant 0
      dlogits[k] = 0.0f;
      continue;
    }
    const float a = dweight[n] * probs[n * K + c];
    dlogits[k] = math::route_logit_grad(a, probs[k], e == c);
  }
}

// ---------------------------------------------------------------------------------------------
// plan: one block of kPlanThreads. Pass 1 counts each class (integer adds commute: the counts do not
// depend on the order). Thread 0 turns them into offsets. Pass 2 walks the tokens in tiles of
// kPlanThreads in token order: a token's row is offsets[c] + (tokens of class c in earlier tiles:
// `running`) + (in earlier warps of this tile: an exclusive scan over the warps in order) + (in
// earlier lanes of its warp: __match_any_sync). That is its rank among the earlier tokens of its
// expert, the CPU's serial counting sort exactly. Work O(N + tiles·32·E), one launch.

constexpr int kPlanThreads = 1024;
constexpr int kPlanWarps = kPlanThreads / 32;
constexpr int64_t kPlanMaxExperts = 256;  // shared memory: (32 warps + 2) × 256 experts of i32, 34 KiB

// status[0] = M, status[1] = the first token whose choice is outside [0, E] (−1 if none),
// status[2] = that choice.
__global__ void moe_plan_kernel(int32_t* counts, int32_t* offsets, int32_t* pos, int32_t* src,
                                int32_t* status, const int32_t* choice, int64_t N, int64_t E) {
  extern __shared__ int32_t smem[];
  int32_t* warp_rank = smem;                      // [kPlanWarps][E]: counts, then exclusive scans
  int32_t* running = warp_rank + kPlanWarps * E;  // [E]
  int32_t* off = running + E;                     // [E]
  __shared__ int first_bad;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) running[e] = 0;
  if (threadIdx.x == 0) first_bad = INT_MAX;
  __syncthreads();
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const int32_t c = choice[n];
    if (c < 0 || c > E)
      atomicMin(&first_bad, static_cast<int>(n));  // a min: order-free
    else if (c < E)
      atomicAdd(&running[c], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    for (int64_t e = 0; e < E; ++e) {
      counts[e] = running[e];
      off[e] = acc;
      offsets[e] = acc;
      acc += running[e];
    }
    offsets[E] = acc;
    status[0] = acc;
    status[1] = first_bad == INT_MAX ? -1 : first_bad;
    status[2] = first_bad == INT_MAX ? 0 : choice[first_bad];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) running[e] = 0;

  for (int64_t base = 0; base < N; base += kPlanThreads) {
    const int64_t n = base + threadIdx.x;
    const int32_t c = n < N ? choice[n] : -1;
    const bool routed = c >= 0 && c < E;  // skipped, out of range and past N: no row
    for (int64_t i = threadIdx.x; i < kPlanWarps * E; i += blockDim.x) warp_rank[i] = 0;
    __syncthreads();
    // Lanes with the same class (−1 for every unrouted one) form one group.
    const unsigned same = __match_any_sync(0xffffffffu, routed ? c : -1);
    const int before_in_warp = __popc(same & ((1u << lane) - 1u));
    if (routed && before_in_warp == 0) warp_rank[warp * E + c] = __popc(same);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {  // exclusive scan over the warps, in order
      int32_t acc = running[e];
      for (int w = 0; w < kPlanWarps; ++w) {
        const int32_t t = warp_rank[w * E + e];
        warp_rank[w * E + e] = acc;
        acc += t;
      }
      running[e] = acc;
    }
    __syncthreads();
    if (n < N) {
      if (routed) {
        const int32_t r = off[c] + warp_rank[warp * E + c] + before_in_warp;
        pos[n] = r;
        src[r] = static_cast<int32_t>(n);
      } else {
        pos[n] = -1;
      }
    }
    __syncthreads();  // warp_rank is cleared for the next tile
  }
}

// ---------------------------------------------------------------------------------------------
// The row copies. Rows of H floats are moved as float4 when H is a multiple of 4 and the pointers
// are 16-byte aligned (the arena aligns to 64), as float otherwise: V is float4 or float, W its
// width in floats, h a column in units of V.

template <class V>
__device__ inline V scaled(float s, V v);
template <>
__device__ inline float scaled(float s, float v) {
  return s * v;
}
template <>
__device__ inline float4 scaled(float s, float4 v) {
  return make_float4(s * v.x, s * v.y, s * v.z, s * v.w);
}
template <class V>
__device__ inline V zero();
template <>
__device__ inline float zero() {
  return 0.0f;
}
template <>
__device__ inline float4 zero() {
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// Each kernel gives a block one row at a time (grid-stride over rows), its threads the row's
// columns: no index division per element.
#define ROWS_OF_BLOCKS(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define COLS_OF_THREADS(h, hv) for (int64_t h = threadIdx.x; h < (hv); h += blockDim.x)

// xp[r] = x[src[r]] for r < rows (xp and src already offset to the first row).
template <class V>
__global__ void moe_gather_kernel(V* xp, const V* x, const int32_t* src, int64_t rows, int64_t hv) {
  ROWS_OF_BLOCKS(r, rows) {
    const V* from = x + static_cast<int64_t>(src[r]) * hv;
    COLS_OF_THREADS(h, hv) xp[r * hv + h] = from[h];
  }
}

// dx[n] = dxp[pos[n]], 0 for skipped tokens.
template <class V>
__global__ void moe_gather_backward_kernel(V* dx, const V* dxp, const int32_t* pos, int64_t N, int64_t hv) {
  ROWS_OF_BLOCKS(n, N) {
    const int32_t r = pos[n];
    const V* from = dxp + static_cast<int64_t>(r < 0 ? 0 : r) * hv;  // not read when skipped
    COLS_OF_THREADS(h, hv) dx[n * hv + h] = r < 0 ? zero<V>() : from[h];
  }
}

// out[n] = w[n]·y[pos[n]], 0 for skipped tokens.
template <class V>
__global__ void moe_unpermute_kernel(V* out, const V* y, const float* weight, const int32_t* pos, int64_t N,
                                     int64_t hv) {
  ROWS_OF_BLOCKS(n, N) {
    const int32_t r = pos[n];
    const float w = weight[n];
    const V* from = y + static_cast<int64_t>(r < 0 ? 0 : r) * hv;  // not read when skipped
    COLS_OF_THREADS(h, hv) out[n * hv + h] = r < 0 ? zero<V>() : scaled(w, from[h]);
  }
}

__device__ inline float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ inline float dot4(float a, float b) { return a * b; }

// y's rows in bf16 (the saved copy of bf16 activations): four at a time as float4's counterpart, and
// every element widened exactly as it is read, so the products and sums are the f32 kernel's on the
// widened values.
struct alignas(8) Bf16x4 {
  bf16 x, y, z, w;
};
__device__ inline float widened(float v) { return v; }
__device__ inline float4 widened(float4 v) { return v; }
__device__ inline float widened(bf16 v) { return to_float(v); }
__device__ inline float4 widened(Bf16x4 v) { return make_float4(to_float(v.x), to_float(v.y), to_float(v.z), to_float(v.w)); }

// One warp per token: dy[pos[n]] = w[n]·dout[n] and dweight[n] = ⟨dout[n], y[pos[n]]⟩, the lanes'
// partial sums added in a fixed butterfly (deterministic). Skipped tokens: dweight 0, no dy row.
template <class V, class Y>
__global__ void moe_unpermute_backward_kernel(V* dy, float* dweight, const V* dout, const Y* y,
                                              const float* weight, const int32_t* pos, int64_t N,
                                              int64_t hv) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; n < N; n += warps) {
    const int32_t r = pos[n];
    if (r < 0) {
      if (lane == 0) dweight[n] = 0.0f;
      continue;
    }
    const float w = weight[n];
    const V* g = dout + n * hv;
    const Y* yr = y + static_cast<int64_t>(r) * hv;
    V* d = dy + static_cast<int64_t>(r) * hv;
    float s = 0.0f;
    for (int64_t h = lane; h < hv; h += 32) {
      const V gv = g[h];
      s += dot4(gv, widened(yr[h]));
      d[h] = scaled(w, gv);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) dweight[n] = s;
  }
}

bool vec4_ok(int64_t H, std::initializer_list<const void*> ptrs) {
  if (H % 4 != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               const Tensor& beta, int64_t N, int64_t E) {
  constexpr std::string_view op = "moe_route";
  auto& ctx = context_for(op);
  const int64_t K = E + 1;
  const bool staged = K <= kRouteStagedMaxK;
  const size_t shared = staged ? static_cast<size_t>(kRouteRows * K) * sizeof(float) : 0;
  const auto blocks = static_cast<unsigned>((N + kRouteRows - 1) / kRouteRows);
  moe_route_kernel<<<blocks, kRouteRows, shared, stream_of(ctx)>>>(
      probs.data<float>(), choice.data<int32_t>(), weight.data<float>(), logits.data<float>(),
      beta.data<float>(), N, K, staged);
  check_launch(op);
}

void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs,
                        const Tensor& choice, int64_t N, int64_t E) {
  constexpr std::string_view op = "moe_route_backward";
  auto& ctx = context_for(op);
  const int64_t K = E + 1;
  moe_route_backward_kernel<<<blocks_for(N * K), kThreads, 0, stream_of(ctx)>>>(
      dlogits.data<float>(), dweight.data<float>(), probs.data<float>(), choice.data<int32_t>(), N, K);
  check_launch(op);
}

int64_t moe_plan(const Tensor& counts, const Tensor& offsets, const Tensor& pos, const Tensor& src,
                 const Tensor& choice, int64_t N, int64_t E) {
  constexpr std::string_view op = "moe_plan";
  ZAYA_CHECK(E <= kPlanMaxExperts, "ops::moe_plan: the CUDA plan takes at most ", kPlanMaxExperts,
             " experts, found E = ", E);
  ZAYA_CHECK(N <= INT32_MAX, "ops::moe_plan: ", N, " tokens do not fit the i32 rows of pos and src");
  auto& ctx = context_for(op);
  auto* status = static_cast<int32_t*>(ctx.scratch(4 * sizeof(int32_t)));
  const size_t shared = static_cast<size_t>((kPlanWarps + 2) * E) * sizeof(int32_t);
  moe_plan_kernel<<<1, kPlanThreads, shared, stream_of(ctx)>>>(
      counts.data<int32_t>(), offsets.data<int32_t>(), pos.data<int32_t>(), src.data<int32_t>(), status,
      choice.data<int32_t>(), N, E);
  check_launch(op);
  int32_t host[3] = {0, -1, 0};
  ctx.copy_async(host, Device::cpu, status, Device::cuda, sizeof(host));
  ctx.synchronize();
  ZAYA_CHECK(host[1] < 0, "moe_plan: choice[", host[1], "] = ", host[2], ", expected an expert in [0, ", E,
             "]");
  return host[0];
}

void moe_gather(const Tensor& xp, const Tensor& x, const Tensor& src, int64_t r0, int64_t r1, int64_t H,
                std::string_view op) {
  auto& ctx = context_for(op);
  const int64_t rows = r1 - r0;
  if (rows == 0) return;
  float* dst = xp.data<float>() + r0 * H;
  const int32_t* s = src.data<int32_t>() + r0;
  if (vec4_ok(H, {dst, x.raw()})) {
    moe_gather_kernel<<<row_blocks(rows), kThreads, 0, stream_of(ctx)>>>(
        reinterpret_cast<float4*>(dst), reinterpret_cast<const float4*>(x.data<float>()), s, rows, H / 4);
  } else {
    moe_gather_kernel<<<row_blocks(rows), kThreads, 0, stream_of(ctx)>>>(dst, x.data<float>(), s, rows, H);
  }
  check_launch(op);
}

void moe_gather_backward(const Tensor& dx, const Tensor& dxp, const Tensor& pos, int64_t N, int64_t H) {
  constexpr std::string_view op = "moe_gather_backward";
  auto& ctx = context_for(op);
  if (vec4_ok(H, {dx.raw(), dxp.raw()})) {
    moe_gather_backward_kernel<<<row_blocks(N), kThreads, 0, stream_of(ctx)>>>(
        reinterpret_cast<float4*>(dx.data<float>()), reinterpret_cast<const float4*>(dxp.data<float>()),
        pos.data<int32_t>(), N, H / 4);
  } else {
    moe_gather_backward_kernel<<<row_blocks(N), kThreads, 0, stream_of(ctx)>>>(
        dx.data<float>(), dxp.data<float>(), pos.data<int32_t>(), N, H);
  }
  check_launch(op);
}

void moe_unpermute(const Tensor& out, const Tensor& y, const Tensor& weight, const Tensor& pos, int64_t N,
                   int64_t H) {
  constexpr std::string_view op = "moe_unpermute";
  auto& ctx = context_for(op);
  if (vec4_ok(H, {out.raw(), y.raw()})) {
    moe_unpermute_kernel<<<row_blocks(N), kThreads, 0, stream_of(ctx)>>>(
        reinterpret_cast<float4*>(out.data<float>()), reinterpret_cast<const float4*>(y.data<float>()),
        weight.data<float>(), pos.data<int32_t>(), N, H / 4);
  } else {
    moe_unpermute_kernel<<<row_blocks(N), kThreads, 0, stream_of(ctx)>>>(
        out.data<float>(), y.data<float>(), weight.data<float>(), pos.data<int32_t>(), N, H);
  }
  check_launch(op);
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& dweight, const Tensor& dout, const Tensor& y,
                            const Tensor& weight, const Tensor& pos, int64_t N, int64_t H) {
  constexpr std::string_view op = "moe_unpermute_backward";
  auto& ctx = context_for(op);
  const auto blocks = static_cast<unsigned>(
      std::clamp<int64_t>((N + kThreads / 32 - 1) / (kThreads / 32), 1, int64_t{1} << 20));
  if (y.dtype() == DType::bf16) {  // four bf16 of a row are 8 bytes: 8-byte aligned rows for Bf16x4
    if (vec4_ok(H, {dy.raw(), dout.raw()}) && reinterpret_cast<uintptr_t>(y.raw()) % 8 == 0) {
      moe_unpermute_backward_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(
          reinterpret_cast<float4*>(dy.data<float>()), dweight.data<float>(),
          reinterpret_cast<const float4*>(dout.data<float>()), reinterpret_cast<const Bf16x4*>(y.data<bf16>()),
          weight.data<float>(), pos.data<int32_t>(), N, H / 4);
    } else {
      moe_unpermute_backward_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(
          dy.data<float>(), dweight.data<float>(), dout.data<float>(), y.data<bf16>(), weight.data<float>(),
          pos.data<int32_t>(), N, H);
    }
  } else if (vec4_ok(H, {dy.raw(), dout.raw(), y.raw()})) {
    moe_unpermute_backward_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(
        reinterpret_cast<float4*>(dy.data<float>()), dweight.data<float>(),
        reinterpret_cast<const float4*>(dout.data<float>()), reinterpret_cast<const float4*>(y.data<float>()),
        weight.data<float>(), pos.data<int32_t>(), N, H / 4);
  } else {
    moe_unpermute_backward_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(
        dy.data<float>(), dweight.data<float>(), dout.data<float>(), y.data<float>(), weight.data<float>(),
        pos.data<int32_t>(), N, H);
  }
  check_launch(op);
}

}  // namespace zaya::ops::cuda
