// CUDA kernels behind zaya/ops/cca.h (arguments checked by the fronts in ops/cca.cc): the CCA
// block's causal convolutions, mean skip, value shift and QK norm, forward and backward side by
// side, the math as in cpu/cca_cpu.cc. fp32 tensors.
//
// The per-element math is sequence_math.h's, shared with the CPU tests. Where no reduction order
// differs (the mean skip, the value shift, the depthwise taps) the result is bitwise the CPU's; the
// grouped convolution's dot products, the QK norm's norms and the parameter gradients' sums run in
// other orders than the CPU's vectorized ones (tests/ops/test_sequence_cuda.cc states the bounds).
// No atomics: parameter gradients are column sums in fixed chunks (launch.cuh), so every result is
// bitwise the same run to run.
#include <cmath>

#include "zaya/ops/cuda/launch.cuh"
#include "zaya/ops/cuda/sequence_cuda.h"
#include "zaya/ops/sequence_math.h"

namespace zaya::ops::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

constexpr int kHeadThreads = 128;  // threads of a block that owns one (token, head)

// Σ over a warp's lanes, the same total in every lane (a fixed butterfly).
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Carves one scratch allocation into float arrays, each 256-byte aligned: a single ctx.scratch
// call per op, since a second one may move the first's memory.
class ScratchPlan {
 public:
  // Reserves `floats` floats; at(base, i) finds the i-th reservation (in the order taken).
  void take(int64_t floats) {
    ZAYA_ASSERT(n_ < kMax);
    offsets_[n_++] = used_;
    used_ += (floats + 63) / 64 * 64;
  }
  size_t bytes() const { return static_cast<size_t>(used_) * sizeof(float); }
  float* at(float* base, int i) const { return base + offsets_[i]; }

 private:
  static constexpr int kMax = 8;
  int64_t used_ = 0, offsets_[kMax] = {};
  int n_ = 0;
};

// The column sums of launch.cuh into a given partial buffer (chunks(rows) × cols floats).
int64_t column_chunks(int64_t rows) { return std::max<int64_t>(1, (rows + kChunkRows - 1) / kChunkRows); }
template <class Term, class Finish>
void column_sums_into(std::string_view op, cudaStream_t stream, float* partial, int64_t rows, int64_t cols,
                      Term term, Finish finish) {
  if (cols == 0) return;
  const int64_t chunks = column_chunks(rows);
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  chunk_column_sums_kernel<<<grid, kThreads, 0, stream>>>(partial, rows, cols, chunks, term);
  check_launch(op);
  finish_column_sums_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(partial, cols, chunks, finish);
  check_launch(op);
}

struct AddTo {  // out[j] += total
  float* out;
  __device__ void operator()(int64_t j, float total) const { out[j] += total; }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Causal convolutions. With the sequence padded once by two zero steps, depthwise slot s ∈ [0, T]:
//     d_s[c] = db[c] + dw[c,0]·z_{s-2}[c] + dw[c,1]·z_{s-1}[c],
// and output t of head g (channels o, i of the head):
//     out_t[o] = gb[o] + Σ_i gw[o,i,0]·d_t[i] + gw[o,i,1]·d_{t+1}[i].
// Backward, with E_t[tap][i] = Σ_o dout_t[o]·gw[o,i,tap] and G_s = E_s[0] + E_{s-1}[1] the total
// gradient of slot s (E_T[0] = E_{-1}[1] = 0):
//     dz_t = G_{t+2}·dw[·,0] + G_{t+1}·dw[·,1]   (G_{T+1} = 0),
//     ddb += Σ G_s,  ddw[·,0] += Σ G_s·z_{s-2},  ddw[·,1] += Σ G_s·z_{s-1},
//     dgw[o,i,tap] += Σ_t dout_t[o]·d_{t+tap}[i],  dgb += Σ_t dout_t.

namespace {

// The input rows z_{t-2}, z_{t-1}, z_t of one token (null: the padding, read as zero).
struct TokenRows {
  const float *zm2, *zm1, *z0;
};
// Token n of [B, T, C].
struct SequenceRows {
  const float* z;
  int64_t T, C;
  __device__ TokenRows operator()(int64_t n) const {
    const int64_t t = n % T;
    const float* row = z + n * C;
    return {t >= 2 ? row - 2 * C : nullptr, t >= 1 ? row - C : nullptr, row};
  }
};
// Batch row b of a decode step: the state's two rows (oldest first), then the new token.
struct DecodeRows {
  const float *state, *z;
  int64_t C;
  __device__ TokenRows operator()(int64_t b) const {
    return {state + b * 2 * C, state + b * 2 * C + C, z + b * C};
  }
};

__device__ inline float at_or_zero(const float* row, int64_t c) { return row ? row[c] : 0.0f; }

// One block per (token, head): the head's depthwise pairs (d_t, d_{t+1}) interleaved in shared
// memory as the grouped weight's [i][tap], then one output per thread, a dot of length 2·hd.
template <class Rows>
__global__ void conv_forward_kernel(float* out, Rows rows, const float* dw, const float* db, const float* gw,
                                    const float* gb, int64_t tokens, int64_t heads, int64_t hd) {
  extern __shared__ float dd[];  // [hd][2]
  const int64_t C = heads * hd;
  for (int64_t task = blockIdx.x; task < tokens * heads; task += gridDim.x) {
    const int64_t n = task / heads, c0 = (task % heads) * hd;
    const TokenRows r = rows(n);
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
      const int64_t c = c0 + i;
      const float a = at_or_zero(r.zm2, c), p = at_or_zero(r.zm1, c), z = r.z0[c];
      dd[2 * i] = math::depthwise_slot(a, p, dw[2 * c], dw[2 * c + 1], db[c]);      // slot t
      dd[2 * i + 1] = math::depthwise_slot(p, z, dw[2 * c], dw[2 * c + 1], db[c]);  // slot t+1
    }
    __syncthreads();
    for (int64_t oo = threadIdx.x; oo < hd; oo += blockDim.x) {
      const int64_t o = c0 + oo;
      const float* w = gw + o * 2 * hd;
      float s = 0.0f;
      for (int64_t k = 0; k < 2 * hd; ++k) s = fmaf(w[k], dd[k], s);
      out[n * C + o] = gb[o] + s;
    }
    __syncthreads();  // dd is rewritten by the next task
  }
}

// state [B, 2, C] ← [state[:, 1], z_new]: after every head has read the window.
__global__ void conv_state_shift_kernel(float* state, const float* z, int64_t B, int64_t C) {
  GRID_STRIDE(k, B * C) {
    const int64_t b = k / C, c = k % C;
    state[b * 2 * C + c] = state[b * 2 * C + C + c];
    state[b * 2 * C + C + c] = z[k];
  }
}

// G [B, T+1, C]: the total gradient of every depthwise slot, the sums over the head's outputs in order.
__global__ void conv_slot_grad_kernel(float* G, const float* dout, const float* gw, int64_t B, int64_t T,
                                      int64_t heads, int64_t hd) {
  const int64_t C = heads * hd;
  GRID_STRIDE(k, B * (T + 1) * C) {
    const int64_t c = k % C, s = (k / C) % (T + 1), b = k / (C * (T + 1));
    const int64_t c0 = c - c % hd, i = c % hd;
    float e0 = 0.0f, e1 = 0.0f;  // E_s[0][i], E_{s-1}[1][i]
    for (int64_t oo = 0; oo < hd; ++oo) {
      const float* w = gw + (c0 + oo) * 2 * hd + 2 * i;
      if (s < T) e0 = fmaf(dout[(b * T + s) * C + c0 + oo], w[0], e0);
      if (s >= 1) e1 = fmaf(dout[(b * T + s - 1) * C + c0 + oo], w[1], e1);
    }
    G[k] = e0 + e1;
  }
}

__global__ void conv_input_grad_kernel(float* dz, const float* G, const float* dw, int64_t B, int64_t T, int64_t C,
                                       bool accumulate) {
  GRID_STRIDE(k, B * T * C) {
    const int64_t c = k % C, t = (k / C) % T, b = k / (C * T);
    const float* Gb = G + b * (T + 1) * C;
    const float g2 = t + 2 <= T ? Gb[(t + 2) * C + c] : 0.0f;  // G_{T+1} = 0
    const float d = math::depthwise_input_grad(g2, Gb[(t + 1) * C + c], dw[2 * c], dw[2 * c + 1]);
    dz[k] = accumulate ? dz[k] + d : d;
  }
}

// Rows r = (b, s) over the B·(T+1) slots; columns [ddb | ddw0 | ddw1 | dgb], C each.
struct ConvBiasTapTerm {
  const float *G, *z, *dout;
  int64_t T, C;
  __device__ float operator()(int64_t r, int64_t col) const {
    const int64_t b = r / (T + 1), s = r % (T + 1), part = col / C, c = col % C;
    const float g = G[r * C + c];
    switch (part) {
      case 0: return g;
      case 1: return s >= 2 ? g * z[(b * T + s - 2) * C + c] : 0.0f;
      case 2: return s >= 1 ? g * z[(b * T + s - 1) * C + c] : 0.0f;
      default: return s < T ? dout[(b * T + s) * C + c] : 0.0f;
    }
  }
};
struct ConvBiasTapFinish {
  float *ddb, *ddw, *dgb;
  int64_t C;
  __device__ void operator()(int64_t col, float total) const {
    const int64_t part = col / C, c = col % C;
    if (part == 0) ddb[c] += total;
    else if (part == 3) dgb[c] += total;
    else ddw[2 * c + part - 1] += total;
  }
};

// Rows: tokens n; columns o·2hd + 2i + tap (the weight's layout): dout_t[o]·d_{t+tap}[i].
struct ConvGroupedWeightTerm {
  const float *dout, *z, *dw, *db;
  int64_t T, C, hd;
  __device__ float operator()(int64_t n, int64_t col) const {
    const int64_t o = col / (2 * hd), i = (col / 2) % hd, tap = col % 2;
    const int64_t c = o - o % hd + i, s = n % T + tap;  // the depthwise slot read, s ≤ T
    const float* zb = z + (n - n % T) * C;              // this sequence's first row
    const float a = s >= 2 ? zb[(s - 2) * C + c] : 0.0f, p = s >= 1 ? zb[(s - 1) * C + c] : 0.0f;
    return dout[n * C + o] * math::depthwise_slot(a, p, dw[2 * c], dw[2 * c + 1], db[c]);
  }
};

template <class Rows>
void conv_forward_launch(std::string_view op, cudaStream_t stream, float* out, Rows rows, const CcaConvWeights& w,
                         int64_t tokens, const CcaDims& dims) {
  const size_t shared = static_cast<size_t>(2 * dims.hd) * sizeof(float);
  conv_forward_kernel<<<row_blocks(tokens * dims.heads()), kHeadThreads, shared, stream>>>(
      out, rows, w.dw_weight.data<float>(), w.dw_bias.data<float>(), w.gw_weight.data<float>(),
      w.gw_bias.data<float>(), tokens, dims.heads(), dims.hd);
  check_launch(op);
}

}  // namespace

void cca_conv_forward(const Tensor& out, const Tensor& z, const CcaConvWeights& w, int64_t B, int64_t T,
                      const CcaDims& dims) {
  constexpr std::string_view op = "cca_conv_forward";
  auto& ctx = context_for(op);
  conv_forward_launch(op, stream_of(ctx), out.data<float>(), SequenceRows{z.data<float>(), T, dims.channels()}, w,
                      B * T, dims);
}

void cca_conv_decode(const Tensor& out, const Tensor& state, const Tensor& z_new, const CcaConvWeights& w,
                     int64_t B, const CcaDims& dims) {
  constexpr std::string_view op = "cca_conv_decode";
  auto& ctx = context_for(op);
  const int64_t C = dims.channels();
  conv_forward_launch(op, stream_of(ctx), out.data<float>(), DecodeRows{state.data<float>(), z_new.data<float>(), C},
                      w, B, dims);
  conv_state_shift_kernel<<<blocks_for(B * C), kThreads, 0, stream_of(ctx)>>>(state.data<float>(),
                                                                              z_new.data<float>(), B, C);
  check_launch(op);
}

void cca_conv_backward(const Tensor& dz, const CcaConvWeights& grads, const Tensor& dout, const Tensor& z,
                       const CcaConvWeights& w, int64_t B, int64_t T, const CcaDims& dims, bool accumulate_dz) {
  constexpr std::string_view op = "cca_conv_backward";
  auto& ctx = context_for(op);
  const cudaStream_t stream = stream_of(ctx);
  const int64_t C = dims.channels(), hd = dims.hd, N = B * T, slots = B * (T + 1);
  ScratchPlan plan;
  plan.take(slots * C);                       // 0: G
  plan.take(column_chunks(slots) * 4 * C);    // 1: partials of the biases and taps
  plan.take(column_chunks(N) * C * 2 * hd);   // 2: partials of the grouped weight
  float* base = static_cast<float*>(ctx.scratch(plan.bytes()));
  float* G = plan.at(base, 0);

  conv_slot_grad_kernel<<<blocks_for(slots * C), kThreads, 0, stream>>>(G, dout.data<float>(),
                                                                       w.gw_weight.data<float>(), B, T,
                                                                       dims.heads(), hd);
  check_launch(op);
  conv_input_grad_kernel<<<blocks_for(N * C), kThreads, 0, stream>>>(dz.data<float>(), G, w.dw_weight.data<float>(),
                                                                    B, T, C, accumulate_dz);
  check_launch(op);
  column_sums_into(op, stream, plan.at(base, 1), slots, 4 * C,
                   ConvBiasTapTerm{G, z.data<float>(), dout.data<float>(), T, C},
                   ConvBiasTapFinish{grads.dw_bias.data<float>(), grads.dw_weight.data<float>(),
                                     grads.gw_bias.data<float>(), C});
  column_sums_into(op, stream, plan.at(base, 2), N, C * 2 * hd,
                   ConvGroupedWeightTerm{dout.data<float>(), z.data<float>(), w.dw_weight.data<float>(),
                                         w.dw_bias.data<float>(), T, C, hd},
                   AddTo{grads.gw_weight.data<float>()});
}

// ---------------------------------------------------------------------------------------------
// Mean skip, per token: m_q^h = ½(q̃^h + k̃^j) for q head h of kv group j, m_k^j = mean_h m_q^h,
// q = conv_q + m_q, k = conv_k + m_k.
// Backward: dm^h = dq^h + dk^j/G; dq̃^h = ½dm^h; dk̃^j = ½ Σ_h dm^h; dconv = [dq | dk].
// One thread per (token, kv group, element), walking the group's heads in order as the CPU does.
// The q̃/k̃ rows and their gradients take row strides: the fused q/k path reads and writes them
// inside z's rows [q̃ | k̃].

namespace {

struct MeanSkipShape {
  int64_t N, nq, nkv, hd, qt_stride, kt_stride;
};

__global__ void mean_skip_forward_kernel(float* q, float* k, const float* conv, const float* qt, const float* kt,
                                         MeanSkipShape s) {
  const int64_t G = s.nq / s.nkv, C = (s.nq + s.nkv) * s.hd;
  const float inv_g = 1.0f / static_cast<float>(G);
  GRID_STRIDE(e, s.N * s.nkv * s.hd) {
    const int64_t d = e % s.hd, j = (e / s.hd) % s.nkv, n = e / (s.hd * s.nkv);
    const float* cv = conv + n * C;
    const float kj = kt[n * s.kt_stride + j * s.hd + d];
    float m_sum = 0.0f;
    for (int64_t h = j * G; h < (j + 1) * G; ++h) {
      const float m = math::mean_skip_m(qt[n * s.qt_stride + h * s.hd + d], kj);
      q[(n * s.nq + h) * s.hd + d] = cv[h * s.hd + d] + m;
      m_sum += m;
    }
    k[(n * s.nkv + j) * s.hd + d] = math::mean_skip_key(cv[(s.nq + j) * s.hd + d], m_sum, inv_g);
  }
}

__global__ void mean_skip_backward_kernel(float* dconv, float* dqt, float* dkt, const float* dq, const float* dk,
                                          MeanSkipShape s) {
  const int64_t G = s.nq / s.nkv, C = (s.nq + s.nkv) * s.hd;
  const float inv_g = 1.0f / static_cast<float>(G);
  GRID_STRIDE(e, s.N * s.nkv * s.hd) {
    const int64_t d = e % s.hd, j = (e / s.hd) % s.nkv, n = e / (s.hd * s.nkv);
    float* dc = dconv + n * C;
    const float dkj = dk[(n * s.nkv + j) * s.hd + d];
    dc[(s.nq + j) * s.hd + d] = dkj;
    float dm_sum = 0.0f;
    for (int64_t h = j * G; h < (j + 1) * G; ++h) {
      const float dqh = dq[(n * s.nq + h) * s.hd + d];
      const float dm = math::mean_skip_dm(dqh, dkj, inv_g);
      dc[h * s.hd + d] = dqh;
      dqt[n * s.qt_stride + h * s.hd + d] = 0.5f * dm;
      dm_sum += dm;
    }
    dkt[n * s.kt_stride + j * s.hd + d] = dm_sum * 0.5f;
  }
}

void mean_skip_forward_launch(std::string_view op, cudaStream_t stream, float* q, float* k, const float* conv,
                              const float* qt, const float* kt, const MeanSkipShape& s) {
  mean_skip_forward_kernel<<<blocks_for(s.N * s.nkv * s.hd), kThreads, 0, stream>>>(q, k, conv, qt, kt, s);
  check_launch(op);
}
void mean_skip_backward_launch(std::string_view op, cudaStream_t stream, float* dconv, float* dqt, float* dkt,
                               const float* dq, const float* dk, const MeanSkipShape& s) {
  mean_skip_backward_kernel<<<blocks_for(s.N * s.nkv * s.hd), kThreads, 0, stream>>>(dconv, dqt, dkt, dq, dk, s);
  check_launch(op);
}

}  // namespace

void mean_skip_forward(const Tensor& q, const Tensor& k, const Tensor& conv, const Tensor& q_tilde,
                       const Tensor& k_tilde, int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "mean_skip_forward";
  auto& ctx = context_for(op);
  const MeanSkipShape s{N, dims.nq, dims.nkv, dims.hd, dims.nq * dims.hd, dims.nkv * dims.hd};
  mean_skip_forward_launch(op, stream_of(ctx), q.data<float>(), k.data<float>(), conv.data<float>(),
                           q_tilde.data<float>(), k_tilde.data<float>(), s);
}

void mean_skip_backward(const Tensor& dconv, const Tensor& dq_tilde, const Tensor& dk_tilde, const Tensor& dq,
                        const Tensor& dk, int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "mean_skip_backward";
  auto& ctx = context_for(op);
  const MeanSkipShape s{N, dims.nq, dims.nkv, dims.hd, dims.nq * dims.hd, dims.nkv * dims.hd};
  mean_skip_backward_launch(op, stream_of(ctx), dconv.data<float>(), dq_tilde.data<float>(), dk_tilde.data<float>(),
                            dq.data<float>(), dk.data<float>(), s);
}

// ---------------------------------------------------------------------------------------------
// Value shift: v_t = [vc_t | vd_{t-1}] (vd_{-1} = 0); backward [dvc_t | dvd_t] = [dv_t[:half] |
// dv_{t+1}[half:]] (0 at a row's end). Copies: bitwise the CPU's.

namespace {

__global__ void value_shift_forward_kernel(float* v, const float* vcd, int64_t B, int64_t T, int64_t half) {
  GRID_STRIDE(e, B * T * 2 * half) {
    const int64_t i = e % (2 * half), bt = e / (2 * half);
    if (i < half) v[e] = vcd[e];
    else v[e] = bt % T == 0 ? 0.0f : vcd[e - 2 * half];  // the previous token's vd
  }
}

__global__ void value_shift_backward_kernel(float* dvcd, const float* dv, int64_t B, int64_t T, int64_t half) {
  GRID_STRIDE(e, B * T * 2 * half) {
    const int64_t i = e % (2 * half), bt = e / (2 * half);
    if (i < half) dvcd[e] = dv[e];
    else dvcd[e] = bt % T == T - 1 ? 0.0f : dv[e + 2 * half];  // vd_t feeds v_{t+1}
  }
}

// v[b] = [vc[b] | state[b]], state[b] ← vd[b]: each thread reads its state element before writing it.
__global__ void value_shift_decode_kernel(float* v, float* state, const float* vc, const float* vd, int64_t B,
                                          int64_t half) {
  GRID_STRIDE(e, B * half) {
    const int64_t b = e / half, i = e % half;
    v[b * 2 * half + i] = vc[e];
    v[b * 2 * half + half + i] = state[e];
    state[e] = vd[e];
  }
}

}  // namespace

void value_shift_forward(const Tensor& v, const Tensor& vcd, int64_t B, int64_t T, int64_t half) {
  constexpr std::string_view op = "value_shift_forward";
  auto& ctx = context_for(op);
  value_shift_forward_kernel<<<blocks_for(B * T * 2 * half), kThreads, 0, stream_of(ctx)>>>(
      v.data<float>(), vcd.data<float>(), B, T, half);
  check_launch(op);
}

void value_shift_backward(const Tensor& dvcd, const Tensor& dv, int64_t B, int64_t T, int64_t half) {
  constexpr std::string_view op = "value_shift_backward";
  auto& ctx = context_for(op);
  value_shift_backward_kernel<<<blocks_for(B * T * 2 * half), kThreads, 0, stream_of(ctx)>>>(
      dvcd.data<float>(), dv.data<float>(), B, T, half);
  check_launch(op);
}

void value_shift_decode(const Tensor& v, const Tensor& state, const Tensor& vc, const Tensor& vd, int64_t B,
                        int64_t half) {
  constexpr std::string_view op = "value_shift_decode";
  auto& ctx = context_for(op);
  value_shift_decode_kernel<<<blocks_for(B * half), kThreads, 0, stream_of(ctx)>>>(
      v.data<float>(), state.data<float>(), vc.data<float>(), vd.data<float>(), B, half);
  check_launch(op);
}

// ---------------------------------------------------------------------------------------------
// QK norm, per (token, head): y = x·√hd / max(‖x‖, ε), keys then ·τ_j.
// Backward: dx = (√hd/n)·(τ·dy − x·τ⟨x, dy⟩/n²) (n > ε; else (√hd/ε)·τ·dy);
//           dτ_j += Σ_tokens (√hd / max(n, ε))·⟨k, dk_out⟩.
// One warp per (token, head): the norms and dots are butterfly sums over the lanes' strided
// partial sums (another order than the CPU's 16-lane dot).

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

struct QkRows {
  int64_t N, nq, nkv, hd;
  // Row (token n, head h) of a [N, nq·hd] (h < nq) or [N, nkv·hd] (h ≥ nq) tensor pair.
  __device__ int64_t offset(int64_t n, int64_t h) const {
    return h < nq ? (n * nq + h) * hd : (n * nkv + h - nq) * hd;
  }
};

__global__ void qk_norm_forward_kernel(float* qo, float* ko, const float* q, const float* k, const float* temp,
                                       QkRows r, float sqrt_hd) {
  const int lane = threadIdx.x % 32;
  const int64_t heads = r.nq + r.nkv;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32; w < r.N * heads;
       w += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t n = w / heads, h = w % heads, off = r.offset(n, h);
    const bool key = h >= r.nq;
    const float* x = (key ? k : q) + off;
    float* y = (key ? ko : qo) + off;
    float ss = 0.0f;
    for (int64_t d = lane; d < r.hd; d += 32) ss = fmaf(x[d], x[d], ss);
    const float s = math::qk_norm_scale(sqrtf(warp_sum(ss)), sqrt_hd);
    const float tau = key ? temp[h - r.nq] : 1.0f;
    for (int64_t d = lane; d < r.hd; d += 32) y[d] = key ? math::mul(math::mul(x[d], s), tau) : math::mul(x[d], s);
  }
}

// dx written; for keys, term[n·nkv + j] = (√hd / max(n, ε))·⟨k, dk_out⟩, dτ's per-token term.
__global__ void qk_norm_backward_kernel(float* dq, float* dk, float* term, const float* dqo, const float* dko,
                                        const float* q, const float* k, const float* temp, QkRows r,
                                        float sqrt_hd) {
  const int lane = threadIdx.x % 32;
  const int64_t heads = r.nq + r.nkv;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32; w < r.N * heads;
       w += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t n = w / heads, h = w % heads, off = r.offset(n, h);
    const bool key = h >= r.nq;
    const float* x = (key ? k : q) + off;
    const float* dy = (key ? dko : dqo) + off;
    float* dx = (key ? dk : dq) + off;
    float ss = 0.0f, xdy = 0.0f;
    for (int64_t d = lane; d < r.hd; d += 32) {
      ss = fmaf(x[d], x[d], ss);
      xdy = fmaf(x[d], dy[d], xdy);
    }
    const float norm = sqrtf(warp_sum(ss));
    xdy = warp_sum(xdy);
    const float tau = key ? temp[h - r.nq] : 1.0f;
    const float proj = norm > FLT_EPSILON ? math::qk_norm_proj(tau, xdy, norm) : 0.0f;
    for (int64_t d = lane; d < r.hd; d += 32) dx[d] = math::qk_norm_input_grad(x[d], dy[d], tau, norm, proj, sqrt_hd);
    if (key && lane == 0) term[n * r.nkv + h - r.nq] = math::qk_norm_scale(norm, sqrt_hd) * xdy;
  }
}

struct RowTerm {  // term[i·cols + j]
  const float* term;
  int64_t cols;
  __device__ float operator()(int64_t i, int64_t j) const { return term[i * cols + j]; }
};

float sqrt_head_dim(int64_t hd) { return static_cast<float>(std::sqrt(static_cast<double>(hd))); }

unsigned warp_blocks(int64_t warps) { return row_blocks((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

void qk_norm_forward_launch(std::string_view op, cudaStream_t stream, float* qo, float* ko, const float* q,
                            const float* k, const float* temp, int64_t N, const CcaDims& d) {
  const QkRows r{N, d.nq, d.nkv, d.hd};
  qk_norm_forward_kernel<<<warp_blocks(N * d.heads()), kThreads, 0, stream>>>(qo, ko, q, k, temp, r,
                                                                             sqrt_head_dim(d.hd));
  check_launch(op);
}

// `term` holds N·nkv floats and `partial` column_chunks(N)·nkv.
void qk_norm_backward_launch(std::string_view op, cudaStream_t stream, float* dq, float* dk, float* dtemp,
                             float* term, float* partial, const float* dqo, const float* dko, const float* q,
                             const float* k, const float* temp, int64_t N, const CcaDims& d) {
  const QkRows r{N, d.nq, d.nkv, d.hd};
  qk_norm_backward_kernel<<<warp_blocks(N * d.heads()), kThreads, 0, stream>>>(dq, dk, term, dqo, dko, q, k, temp,
                                                                              r, sqrt_head_dim(d.hd));
  check_launch(op);
  column_sums_into(op, stream, partial, N, d.nkv, RowTerm{term, d.nkv}, AddTo{dtemp});
}

}  // namespace

void qk_norm_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k, const Tensor& temp,
                     int64_t N, const CcaDims& dims) {
  constexpr std::string_view op = "qk_norm_forward";
  auto& ctx = context_for(op);
  qk_norm_forward_launch(op, stream_of(ctx), q_out.data<float>(), k_out.data<float>(), q.data<float>(),
                         k.data<float>(), temp.data<float>(), N, dims);
}

void qk_norm_backward(const Tensor& dq, const Tensor& dk, const Tensor& dtemp, const Tensor& dq_out,
                      const Tensor& dk_out, const Tensor& q, const Tensor& k, const Tensor& temp, int64_t N,
                      const CcaDims& dims) {
  constexpr std::string_view op = "qk_norm_backward";
  auto& ctx = context_for(op);
  ScratchPlan plan;
  plan.take(N * dims.nkv);
  plan.take(column_chunks(N) * dims.nkv);
  float* base = static_cast<float*>(ctx.scratch(plan.bytes()));
  qk_norm_backward_launch(op, stream_of(ctx), dq.data<float>(), dk.data<float>(), dtemp.data<float>(),
                          plan.at(base, 0), plan.at(base, 1), dq_out.data<float>(), dk_out.data<float>(),
                          q.data<float>(), k.data<float>(), temp.data<float>(), N, dims);
}

// ---------------------------------------------------------------------------------------------
// The q/k path after the conv: mean skip → QK norm → RoPE at positions 0..T−1, as the three ops in
// turn (the CPU fuses them per token; here they are three passes, each the op's own kernel, so the
// values are those of the separate CUDA ops bit for bit). The backward runs the inverse RoPE, the
// QK-norm backward and the mean-skip backward into intermediate rows in scratch.

void cca_qk_forward(const Tensor& q, const Tensor& k, const Tensor& q_pre, const Tensor& k_pre, const Tensor& conv,
                    const Tensor& z, const Tensor& temp, const RopeTable& rope, int64_t B, int64_t T,
                    const CcaDims& dims) {
  constexpr std::string_view op = "cca_qk_forward";
  auto& ctx = context_for(op);
  const cudaStream_t stream = stream_of(ctx);
  const int64_t N = B * T, C = dims.channels(), rq = dims.nq * dims.hd;
  const MeanSkipShape s{N, dims.nq, dims.nkv, dims.hd, C, C};  // q̃, k̃ inside z's rows
  mean_skip_forward_launch(op, stream, q_pre.data<float>(), k_pre.data<float>(), conv.data<float>(),
                           z.data<float>(), z.data<float>() + rq, s);
  qk_norm_forward_launch(op, stream, q.data<float>(), k.data<float>(), q_pre.data<float>(), k_pre.data<float>(),
                         temp.data<float>(), N, dims);
  rope_apply(q, q, rope, B, T, dims.nq, dims.hd, 0, 1.0f);
  rope_apply(k, k, rope, B, T, dims.nkv, dims.hd, 0, 1.0f);
}

void cca_qk_backward(const Tensor& dconv, const Tensor& dz, const Tensor& dtemp, const Tensor& dq, const Tensor& dk,
                     const Tensor& q_pre, const Tensor& k_pre, const Tensor& temp, const RopeTable& rope, int64_t B,
                     int64_t T, const CcaDims& dims) {
  constexpr std::string_view op = "cca_qk_backward";
  auto& ctx = context_for(op);
  const cudaStream_t stream = stream_of(ctx);
  const int64_t N = B * T, C = dims.channels(), rq = dims.nq * dims.hd, rk = dims.nkv * dims.hd;
  ScratchPlan plan;
  plan.take(N * rq);                           // 0: dq before the RoPE
  plan.take(N * rk);                           // 1: dk before the RoPE
  plan.take(N * rq);                           // 2: dq before the QK norm
  plan.take(N * rk);                           // 3: dk before the QK norm
  plan.take(N * dims.nkv);                     // 4: dτ's per-token terms
  plan.take(column_chunks(N) * dims.nkv);      // 5: their partial sums
  float* base = static_cast<float*>(ctx.scratch(plan.bytes()));
  const Tensor gq = Tensor::borrow(plan.at(base, 0), Shape{N, rq}, DType::f32, Device::cuda);
  const Tensor gk = Tensor::borrow(plan.at(base, 1), Shape{N, rk}, DType::f32, Device::cuda);
  rope_apply(gq, dq, rope, B, T, dims.nq, dims.hd, 0, -1.0f);
  rope_apply(gk, dk, rope, B, T, dims.nkv, dims.hd, 0, -1.0f);
  float *dqn = plan.at(base, 2), *dkn = plan.at(base, 3);
  qk_norm_backward_launch(op, stream, dqn, dkn, dtemp.data<float>(), plan.at(base, 4), plan.at(base, 5),
                          plan.at(base, 0), plan.at(base, 1), q_pre.data<float>(), k_pre.data<float>(),
                          temp.data<float>(), N, dims);
  const MeanSkipShape s{N, dims.nq, dims.nkv, dims.hd, C, C};  // dq̃, dk̃ into z's rows
  mean_skip_backward_launch(op, stream, dconv.data<float>(), dz.data<float>(), dz.data<float>() + rq, dqn, dkn, s);
}

}  // namespace zaya::ops::cuda
