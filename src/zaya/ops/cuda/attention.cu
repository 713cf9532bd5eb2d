// CUDA kernels behind zaya/ops/attention.h (arguments checked by the fronts in ops/attention.cc):
// causal grouped-query attention, q head h reading kv head ⌊h/G⌋ (G = nq/nkv), scale 1/√hd, query i
// attending to keys j ≤ i. Two implementations of the training forward and backward (docs/cuda.md,
// "Attention"): cuDNN's fused SDPA in bf16 (attention_cudnn_cuda.cc) and the fp32 reference kernels
// below, which the tests compare against the CPU and the GPU check compares cuDNN against. The
// positioned forms (attention_at_*, a context-parallel rank's chunk of queries at global positions
// q_pos.. against the gathered keys 0..Tk−1) always run the reference kernels, with the key offset
// q_pos: query i sees keys j ≤ i + q_pos, and dk, dv are added to rather than written.
//
// The reference kernels give one warp to one row (a query row forward and for dq; a key row for dk
// and dv), the lanes holding the head's dims d = lane + 32·r in registers, every score a butterfly
// sum over the lanes. Simple and exact in fp32, not fast: no tiles in shared memory, no tensor
// cores. Forward, online softmax over the keys in order:
//     m_j = max(m_{j-1}, s_j),  l_j = l_{j-1}·e^{m_{j-1}−m_j} + e^{s_j−m_j},
//     acc_j = acc_{j-1}·e^{m_{j-1}−m_j} + e^{s_j−m_j}·v_j,   out = acc/l,  lse = m + log l,
// with s_j = scale·⟨q, k_j⟩. Backward from lse, with P_ij = exp(s_ij − lse_i), D_i = ⟨dO_i, O_i⟩,
// dS_ij = P_ij·(⟨dO_i, v_j⟩ − D_i):
//     dq_i = scale·Σ_{j≤i} dS_ij·k_j,   dk_j = scale·Σ_{h in group, i≥j} dS_ij·q_i,
//     dv_j = Σ_{h in group, i≥j} P_ij·dO_i
// (with a key offset o: j ≤ i + o and i ≥ j − o).
// Each output has one writer summing in a fixed order, so results are bitwise the same run to run.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "zaya/ops/cuda/attention_cudnn.h"
#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/sequence_cuda.h"
#include "zaya/ops/sequence_math.h"

namespace zaya::ops::cuda {
namespace {

constexpr int kWarps = kThreads / 32;  // rows per block

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where the rows are: q and out [B, Tq, nq, hd]; k and v [B, kv_rows, nkv, hd] of which query i sees
// keys 0 .. min(i + key_offset, kv_rows − 1) (training: kv_rows = Tq, key_offset 0; a context-parallel chunk: kv_rows
// = Tk gathered keys, key_offset = the chunk's first position q_pos; decode: one query against S
// of a cache of kv_rows = S_cap positions, key_offset S − 1).
struct Rows {
  int64_t B, Tq, nq, nkv, hd, kv_rows, key_offset;
  __device__ int64_t q_at(int64_t b, int64_t i, int64_t h) const { return ((b * Tq + i) * nq + h) * hd; }
  __device__ int64_t kv_at(int64_t b, int64_t j, int64_t g) const { return ((b * kv_rows + j) * nkv + g) * hd; }
  __device__ int64_t group(int64_t h) const { return h / (nq / nkv); }
  // Query i's last key: causal at the offset, and never past the kv_rows that exist (a key_offset
  // ≥ kv_rows makes every key visible: the keys before a chunk, attention_prefix_*).
  __device__ int64_t last_key(int64_t i) const { return min(i + key_offset, kv_rows - 1); }
};

// A head row in registers: lane holds dims lane, lane + 32, ... (kPer of them, hd ≤ 32·kPer).
template <int kPer>
struct Reg {
  float x[kPer];
  __device__ void load(const float* row, int64_t hd, int lane) {
#pragma unroll
    for (int r = 0; r < kPer; ++r) x[r] = lane + 32 * r < hd ? row[lane + 32 * r] : 0.0f;
  }
  __device__ void fill(float v) {
#pragma unroll
    for (int r = 0; r < kPer; ++r) x[r] = v;
  }
  // ⟨this, row⟩ over the warp, the same total in every lane.
  __device__ float dot(const float* row, int64_t hd, int lane) const {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < kPer; ++r)
      if (lane + 32 * r < hd) s = fmaf(x[r], row[lane + 32 * r], s);
    return warp_sum(s);
  }
  // this = this·a + b·row
  __device__ void scale_add(float a, float b, const float* row, int64_t hd, int lane) {
#pragma unroll
    for (int r = 0; r < kPer; ++r)
      if (lane + 32 * r < hd) x[r] = fmaf(b, row[lane + 32 * r], x[r] * a);
  }
  __device__ void store(float* row, float a, int64_t hd, int lane) const {
#pragma unroll
    for (int r = 0; r < kPer; ++r)
      if (lane + 32 * r < hd) row[lane + 32 * r] = x[r] * a;
  }
  // row += this·a
  __device__ void add_to(float* row, float a, int64_t hd, int lane) const {
#pragma unroll
    for (int r = 0; r < kPer; ++r)
      if (lane + 32 * r < hd) row[lane + 32 * r] += x[r] * a;
  }
};

// Warp w of the grid, grid-striding over `count` rows.
#define WARP_ROWS(w, count)                                                                          \
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; w < (count);        \
       w += static_cast<int64_t>(gridDim.x) * kWarps)

// One warp per query row (b, h, i), i fastest, so a block's warps read the same keys.
template <int kPer>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(float* out, float* lse, const float* q,
                                                                     const float* k, const float* v, Rows s,
                                                                     float scale) {
  const int lane = threadIdx.x % 32;
  WARP_ROWS(w, s.B * s.nq * s.Tq) {
    const int64_t i = w % s.Tq, h = (w / s.Tq) % s.nq, b = w / (s.Tq * s.nq), g = s.group(h);
    Reg<kPer> qr, acc;
    qr.load(q + s.q_at(b, i, h), s.hd, lane);
    acc.fill(0.0f);
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= s.last_key(i); ++j) {
      const float sj = qr.dot(k + s.kv_at(b, j, g), s.hd, lane) * scale;
      const float m_new = fmaxf(m, sj);
      const float alpha = expf(m - m_new);  // 0 for the first key (m = −∞)
      const float p = expf(sj - m_new);
      l = fmaf(l, alpha, p);
      acc.scale_add(alpha, p, v + s.kv_at(b, j, g), s.hd, lane);
      m = m_new;
    }
    acc.store(out + s.q_at(b, i, h), 1.0f / l, s.hd, lane);
    if (lse && lane == 0) lse[(b * s.nq + h) * s.Tq + i] = m + logf(l);
  }
}

// D [B, nq, T] = ⟨dO_i, O_i⟩ per query row.
template <int kPer>
__global__ void __launch_bounds__(kThreads) attention_delta_kernel(float* D, const float* dout, const float* out,
                                                                   Rows s) {
  const int lane = threadIdx.x % 32;
  WARP_ROWS(w, s.B * s.nq * s.Tq) {
    const int64_t i = w % s.Tq, h = (w / s.Tq) % s.nq, b = w / (s.Tq * s.nq);
    Reg<kPer> dor;
    dor.load(dout + s.q_at(b, i, h), s.hd, lane);
    const float d = dor.dot(out + s.q_at(b, i, h), s.hd, lane);
    if (lane == 0) D[w] = d;
  }
}

// dq_i = scale·Σ_{j≤i} dS_ij·k_j, one warp per query row.
template <int kPer>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(float* dq, const float* dout, const float* q,
                                                                const float* k, const float* v, const float* lse,
                                                                const float* D, Rows s, float scale,
                                                                bool accumulate) {
  const int lane = threadIdx.x % 32;
  WARP_ROWS(w, s.B * s.nq * s.Tq) {
    const int64_t i = w % s.Tq, h = (w / s.Tq) % s.nq, b = w / (s.Tq * s.nq), g = s.group(h);
    Reg<kPer> qr, dor, acc;
    qr.load(q + s.q_at(b, i, h), s.hd, lane);
    dor.load(dout + s.q_at(b, i, h), s.hd, lane);
    acc.fill(0.0f);
    const float L = lse[w], Di = D[w];
    for (int64_t j = 0; j <= s.last_key(i); ++j) {
      const float* kj = k + s.kv_at(b, j, g);
      const float p = math::attention_prob(qr.dot(kj, s.hd, lane), scale, L);
      const float ds = math::attention_dscore(p, dor.dot(v + s.kv_at(b, j, g), s.hd, lane), Di);
      acc.scale_add(1.0f, ds, kj, s.hd, lane);
    }
    if (accumulate)
      acc.add_to(dq + s.q_at(b, i, h), scale, s.hd, lane);
    else
      acc.store(dq + s.q_at(b, i, h), scale, s.hd, lane);
  }
}

// dk_j, dv_j of kv head g: the group's q heads in order, each over the queries that see key j
// (i ≥ j − key_offset) in order. `accumulate`: added to dk, dv (a context-parallel rank's chunks
// add into one gathered buffer) rather than written.
template <int kPer>
__global__ void __launch_bounds__(kThreads) attention_dkdv_kernel(float* dk, float* dv, const float* dout,
                                                                  const float* q, const float* k, const float* v,
                                                                  const float* lse, const float* D, Rows s,
                                                                  float scale, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t G = s.nq / s.nkv;
  WARP_ROWS(w, s.B * s.nkv * s.kv_rows) {
    const int64_t j = w % s.kv_rows, g = (w / s.kv_rows) % s.nkv, b = w / (s.kv_rows * s.nkv);
    const int64_t first_query = j > s.key_offset ? j - s.key_offset : 0;
    Reg<kPer> kr, vr, dk_acc, dv_acc;
    kr.load(k + s.kv_at(b, j, g), s.hd, lane);
    vr.load(v + s.kv_at(b, j, g), s.hd, lane);
    dk_acc.fill(0.0f);
    dv_acc.fill(0.0f);
    for (int64_t h = g * G; h < (g + 1) * G; ++h) {
      const int64_t row0 = (b * s.nq + h) * s.Tq;
      for (int64_t i = first_query; i < s.Tq; ++i) {
        const float* qi = q + s.q_at(b, i, h);
        const float* doi = dout + s.q_at(b, i, h);
        const float p = math::attention_prob(kr.dot(qi, s.hd, lane), scale, lse[row0 + i]);
        dv_acc.scale_add(1.0f, p, doi, s.hd, lane);
        const float ds = math::attention_dscore(p, vr.dot(doi, s.hd, lane), D[row0 + i]);
        dk_acc.scale_add(1.0f, ds, qi, s.hd, lane);
      }
    }
    if (accumulate) {
      dk_acc.add_to(dk + s.kv_at(b, j, g), scale, s.hd, lane);
      dv_acc.add_to(dv + s.kv_at(b, j, g), 1.0f, s.hd, lane);
    } else {
      dk_acc.store(dk + s.kv_at(b, j, g), scale, s.hd, lane);
      dv_acc.store(dv + s.kv_at(b, j, g), 1.0f, s.hd, lane);
    }
  }
}

unsigned warp_blocks(int64_t rows) { return row_blocks((rows + kWarps - 1) / kWarps); }
float attention_scale(int64_t hd) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))); }

// Calls f.template operator()<kPer>() with the smallest kPer whose 32·kPer dims hold hd.
template <class F>
void with_dims_per_lane(std::string_view op, int64_t hd, F&& f) {
  if (hd <= 32) return f.template operator()<1>();
  if (hd <= 64) return f.template operator()<2>();
  if (hd <= 128) return f.template operator()<4>();
  if (hd <= 256) return f.template operator()<8>();
  throw Error(str("ops::", op, ": the CUDA attention kernels take head_dim up to 256, found ", hd));
}

void reference_forward(std::string_view op, float* out, float* lse, const float* q, const float* k, const float* v,
                       const Rows& s) {
  auto& ctx = context_for(op);
  with_dims_per_lane(op, s.hd, [&]<int kPer>() {
    attention_forward_kernel<kPer><<<warp_blocks(s.B * s.nq * s.Tq), kThreads, 0, stream_of(ctx)>>>(
        out, lse, q, k, v, s, attention_scale(s.hd));
  });
  check_launch(op);
}

void reference_backward(std::string_view op, float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, const Rows& s,
                        bool accumulate_kv, bool accumulate_q = false) {
  auto& ctx = context_for(op);
  const cudaStream_t stream = stream_of(ctx);
  const int64_t rows = s.B * s.nq * s.Tq;
  auto* D = static_cast<float*>(ctx.scratch(static_cast<size_t>(rows) * sizeof(float)));
  const float scale = attention_scale(s.hd);
  with_dims_per_lane(op, s.hd, [&]<int kPer>() {
    attention_delta_kernel<kPer><<<warp_blocks(rows), kThreads, 0, stream>>>(D, dout, out, s);
    attention_dq_kernel<kPer><<<warp_blocks(rows), kThreads, 0, stream>>>(dq, dout, q, k, v, lse, D, s, scale,
                                                                           accumulate_q);
    attention_dkdv_kernel<kPer><<<warp_blocks(s.B * s.nkv * s.kv_rows), kThreads, 0, stream>>>(
        dk, dv, dout, q, k, v, lse, D, s, scale, accumulate_kv);
  });
  check_launch(op);
}

// ---------------------------------------------------------------------------------------------
// Which implementation runs.

std::optional<AttentionImpl> parse_impl(const char* s) {
  if (!s || !*s) return std::nullopt;
  const std::string v(s);
  if (v == "reference") return AttentionImpl::reference;
  if (v == "cudnn") return AttentionImpl::cudnn;
  throw Error(str("ZAYA_CUDA_ATTENTION must be 'reference' or 'cudnn', found '", v, "'"));
}

thread_local std::optional<AttentionImpl> chosen;

bool use_cudnn(int64_t hd) { return attention_impl() == AttentionImpl::cudnn && cudnn_sdpa::supports_head_dim(hd); }

}  // namespace

const char* attention_impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::cudnn ? "cudnn" : "reference";
}

bool cudnn_attention_available(std::string* why) { return cudnn_sdpa::available(why); }

void set_attention_impl(AttentionImpl impl) {
  std::string why;
  if (impl == AttentionImpl::cudnn && !cudnn_sdpa::available(&why))
    throw Error(str("cuDNN attention was asked for, but ", why));
  chosen = impl;
}

AttentionImpl attention_impl() {
  if (!chosen) {
    static const std::optional<AttentionImpl> from_env = parse_impl(std::getenv("ZAYA_CUDA_ATTENTION"));
    if (from_env) set_attention_impl(*from_env);
    else chosen = cudnn_sdpa::available(nullptr) ? AttentionImpl::cudnn : AttentionImpl::reference;
  }
  return *chosen;
}

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  constexpr std::string_view op = "attention_forward";
  context_for(op);
  if (use_cudnn(hd))
    return cudnn_sdpa::forward(out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(),
                               v.data<float>(), B, T, nq, nkv, hd);
  reference_forward(op, out.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                    Rows{B, T, nq, nkv, hd, T, 0});
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                        int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  context_for("attention_backward");
  if (use_cudnn(hd))
    return cudnn_sdpa::backward(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                                q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                lse.data<float>(), B, T, nq, nkv, hd);
  reference_backward("attention_backward", dq.data<float>(), dk.data<float>(), dv.data<float>(),
                     dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                     lse.data<float>(), Rows{B, T, nq, nkv, hd, T, 0}, /*accumulate_kv=*/false);
}

// A chunk of Tq queries at positions q_pos.. against Tk keys: the fp32 reference kernels with the
// key offset q_pos. Not cuDNN: its SDPA runs in bf16 (context parallelism is held to the one-rank
// fp32 results within 1e-5), takes a key offset only as a bottom-right-aligned mask (Tk = q_pos +
// Tq), and writes dk, dv where the chunks of a rank must add into one buffer.
void attention_at_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                          int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd) {
  reference_forward("attention_at_forward", out.data<float>(), lse.data<float>(), q.data<float>(),
                    k.data<float>(), v.data<float>(), Rows{B, Tq, nq, nkv, hd, Tk, q_pos});
}

void attention_at_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                           const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                           int64_t B, int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd,
                           bool accumulate_dq) {
  reference_backward("attention_at_backward", dq.data<float>(), dk.data<float>(), dv.data<float>(),
                     dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                     lse.data<float>(), Rows{B, Tq, nq, nkv, hd, Tk, q_pos}, /*accumulate_kv=*/true, accumulate_dq);
}

// Every query against every one of Tk keys: the reference kernels with a key offset of Tk (each
// query's last key is then kv_rows − 1); dq, dk, dv added to.
void attention_prefix_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv,
                              int64_t hd) {
  reference_forward("attention_prefix_forward", out.data<float>(), lse.data<float>(), q.data<float>(),
                    k.data<float>(), v.data<float>(), Rows{B, Tq, nq, nkv, hd, Tk, Tk});
}

void attention_prefix_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t nq, int64_t nkv,
                               int64_t hd) {
  reference_backward("attention_prefix_backward", dq.data<float>(), dk.data<float>(), dv.data<float>(),
                     dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                     lse.data<float>(), Rows{B, Tq, nq, nkv, hd, Tk, Tk}, /*accumulate_kv=*/true,
                     /*accumulate_q=*/true);
}

namespace {
// One thread per output element: its row's merge weights (math::softmax_merge, recomputed per
// element from the unchanged lse), then the weighted sum. The lse rows are merged by a second
// kernel, after every element has read them.
__global__ void attention_merge_out_kernel(float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                                           int64_t T, int64_t nq, int64_t hd, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / hd, h = row % nq, i = (row / nq) % T, b = row / (nq * T), l = (b * nq + h) * T + i;
    const math::SoftmaxMerge w = math::softmax_merge(lse_a[l], lse_b[l]);
    out_a[e] = math::softmax_merge_out(w, out_a[e], out_b[e]);
  }
}
__global__ void attention_merge_lse_kernel(float* lse_a, const float* lse_b, int64_t n) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < n;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x)
    lse_a[l] = math::softmax_merge(lse_a[l], lse_b[l]).lse;
}
}  // namespace

void attention_merge(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                     int64_t T, int64_t nq, int64_t hd) {
  constexpr std::string_view op = "attention_merge";
  auto& ctx = context_for(op);
  const cudaStream_t stream = stream_of(ctx);
  const int64_t n = B * T * nq * hd, rows = B * T * nq;
  attention_merge_out_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out_a.data<float>(), lse_a.data<float>(),
                                                                     out_b.data<float>(), lse_b.data<float>(), T, nq,
                                                                     hd, n);
  attention_merge_lse_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(lse_a.data<float>(), lse_b.data<float>(),
                                                                        rows);
  check_launch(op);
}

// One query per batch row against the first S positions of a cache of S_cap: the forward kernel with
// Tq = 1 and the query at position S − 1. No lse (decoding needs no backward).
void attention_decode(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t B,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd) {
  const int64_t cap = k_cache.size(1);
  reference_forward("attention_decode", out.data<float>(), nullptr, q.data<float>(), k_cache.data<float>(),
                    v_cache.data<float>(), Rows{B, 1, nq, nkv, hd, cap, S - 1});
}

// ---------------------------------------------------------------------------------------------
// fp32 ↔ bf16 for cuDNN's SDPA (core's to_bf16: round to nearest even, as the CPU rounds).

namespace {
__global__ void to_bf16_kernel(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = to_bf16(src[i]);
}
__global__ void to_f32_kernel(float* dst, const bf16* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = to_float(src[i]);
}
}  // namespace

namespace cudnn_sdpa {
void to_bf16(void* dst, const float* src, int64_t n, void* stream) {
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<bf16*>(dst), src, n);
  check_launch("attention (cuDNN): fp32 to bf16");
}
void to_f32(float* dst, const void* src, int64_t n, void* stream) {
  to_f32_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst, static_cast<const bf16*>(src),
                                                                                  n);
  check_launch("attention (cuDNN): bf16 to fp32");
}
}  // namespace cudnn_sdpa

}  // namespace zaya::ops::cuda
