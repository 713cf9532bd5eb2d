// Sequence-op throughput on the CPU: causal GQA attention forward and backward (GFLOP/s, counting
// causal FLOPs 2·2·B·nq·T²·hd/2 forward and 2.5× that backward, the usual flash-attention
// convention; wall-clock rates), and GB/s for the CCA convolution, RoPE and the MoE gather (bytes read + written)
// at the model's sequence lengths and at a length whose tensors are beyond the caches
// (stream_ref.h), next to a STREAM triad of that size measured in the same binary.
//   ./bench_ops_attention --benchmark_min_time=0.05   (this libbenchmark takes a plain number)
#include <benchmark/benchmark.h>

#include <vector>

#include "stream_ref.h"
#include "zaya/core/random.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/cpu/tile_mm.h"
#include "zaya/ops/moe.h"
#include "zaya/ops/optim_ops.h"
#include "zaya/ops/rope.h"

namespace {

using namespace zaya;

Tensor rnd(const Shape& s, uint64_t seed) { return bench::random_normal(s, seed); }

// q for args B, T, hd, nq, nkv, and a scale: 1 for scores of standard deviation 1, larger for
// peaky rows (×30: deviation 30, so most of a row's probabilities would be subnormal without the
// kernels' flush).
Tensor queries(const benchmark::State& st) {
  Tensor q = rnd({st.range(0), st.range(1), st.range(3), st.range(2)}, 1);
  if (st.range(5) != 1) ops::scale_inplace(q, static_cast<float>(st.range(5)));
  return q;
}

// Args: B, T, hd, nq, nkv, q scale.
void BM_AttentionForward(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1), hd = st.range(2), nq = st.range(3), nkv = st.range(4);
  Tensor q = queries(st), k = rnd({B, T, nkv, hd}, 2), v = rnd({B, T, nkv, hd}, 3);
  Tensor o = Tensor::empty(q.shape(), DType::f32), lse = Tensor::empty({B, nq, T}, DType::f32);
  for (auto _ : st) ops::attention_forward(o, lse, q, k, v, B, T, nq, nkv, hd);
  const double flops = 2.0 * 2.0 * B * nq * double(T) * T * hd / 2;
  st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * st.iterations(), benchmark::Counter::kIsRate);
}

void BM_AttentionBackward(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1), hd = st.range(2), nq = st.range(3), nkv = st.range(4);
  Tensor q = queries(st), k = rnd({B, T, nkv, hd}, 2), v = rnd({B, T, nkv, hd}, 3);
  Tensor o = Tensor::empty(q.shape(), DType::f32), lse = Tensor::empty({B, nq, T}, DType::f32);
  Tensor dout = rnd(q.shape(), 4), dq = Tensor::empty(q.shape(), DType::f32);
  Tensor dk = Tensor::empty(k.shape(), DType::f32), dv = Tensor::empty(v.shape(), DType::f32);
  ops::attention_forward(o, lse, q, k, v, B, T, nq, nkv, hd);
  for (auto _ : st) ops::attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, T, nq, nkv, hd);
  const double flops = 2.5 * 2.0 * 2.0 * B * nq * double(T) * T * hd / 2;
  st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * st.iterations(), benchmark::Counter::kIsRate);
}

// The register-blocked tile product every attention and CCA-backward tile runs through
// (cpu::mm), alone on one thread: 64×64×64, accumulating, the operands in L1. The ceiling for the
// attention kernels' rate per core.
void BM_TileMm64(benchmark::State& st) {
  constexpr int64_t n = 64;
  Tensor a = rnd({n, n}, 1), b = rnd({n, n}, 2), c = rnd({n, n}, 3);
  for (auto _ : st) {
    ops::cpu::mm(c.data<float>(), n, a.data<float>(), n, 1, b.data<float>(), n, n, n, n, true);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * 1e-9 * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TileMm64);

void attention_args(benchmark::internal::Benchmark* b) {
  for (int64_t T : {256, 1024, 4096}) {
    b->Args({1, T, 128, 8, 2, 1});  // ZAYA1
    b->Args({1, T, 64, 4, 2, 1});   // the demo config
  }
  for (int64_t scale : {1, 30, 100})
    b->Args({8, 256, 64, 4, 2, scale});  // the demo's step: 8 rows of 256 tokens
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_AttentionForward)->Apply(attention_args);
BENCHMARK(BM_AttentionBackward)->Apply(attention_args);

// Tokens whose [T, 2048]-float activations are beyond the caches (each tensor ≥ 4× the caches),
// for the memory-bound ops below; the triad runs on arrays of the same size.
const int64_t kBeyondCacheT = bench::stream_elems(2048) / 2048;
void BM_stream_triad(benchmark::State& st) { bench::stream_triad(st, kBeyondCacheT * 2048); }
BENCHMARK(BM_stream_triad)->Unit(benchmark::kMillisecond)->UseRealTime();

Tensor zeros(const Shape& s) { return bench::faulted_zeros(s); }

// The CCA conv is not a streaming op: each output channel is a 2-tap conv over all hd channels of
// its head (the grouped conv, 4·hd FLOPs) after a 2-tap depthwise one (4 FLOPs): ~64 FLOPs per byte
// moved at hd 128, so it is compute-bound and its rate is given in GFLOP/s as well as GB/s.
double cca_conv_flops(int64_t tokens, const ops::CcaDims& d) {
  return static_cast<double>(tokens) * static_cast<double>(d.channels()) * 4.0 * static_cast<double>(d.hd + 1);
}

// CCA conv over [B, T, C]. Args: B, T, hd, nq, nkv (ZAYA1: nq 8, nkv 2, hd 128, C = 1280; the demo
// step: 8 × 256 tokens, nq 4, nkv 2, hd 64, C = 384).
void BM_CcaConvForward(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1);
  ops::CcaDims d{st.range(3), st.range(4), st.range(2)};
  const int64_t C = d.channels();
  Tensor z = rnd({B, T, C}, 1), out = zeros({B, T, C});
  ops::CcaConvWeights w{rnd({C, 1, 2}, 2), rnd({C}, 3), rnd({C, d.hd, 2}, 4), rnd({C}, 5)};
  for (auto _ : st) ops::cca_conv_forward(out, z, w, B, T, d);
  st.counters["GB/s"] = benchmark::Counter(2.0 * B * T * C * 4 * st.iterations() * 1e-9, benchmark::Counter::kIsRate);
  st.counters["GFLOP/s"] = benchmark::Counter(cca_conv_flops(B * T, d) * 1e-9 * st.iterations(), benchmark::Counter::kIsRate);
}
void BM_CcaConvBackward(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1);
  ops::CcaDims d{st.range(3), st.range(4), st.range(2)};
  const int64_t C = d.channels();
  Tensor z = rnd({B, T, C}, 1), dout = rnd({B, T, C}, 6), dz = zeros({B, T, C});
  ops::CcaConvWeights w{rnd({C, 1, 2}, 2), rnd({C}, 3), rnd({C, d.hd, 2}, 4), rnd({C}, 5)};
  ops::CcaConvWeights g{Tensor::zeros({C, 1, 2}, DType::f32), Tensor::zeros({C}, DType::f32),
                        Tensor::zeros({C, d.hd, 2}, DType::f32), Tensor::zeros({C}, DType::f32)};
  for (auto _ : st) ops::cca_conv_backward(dz, g, dout, z, w, B, T, d);
  st.counters["GB/s"] = benchmark::Counter(3.0 * B * T * C * 4 * st.iterations() * 1e-9, benchmark::Counter::kIsRate);
  // dz and the grouped weight's gradient each cost what the forward does.
  st.counters["GFLOP/s"] = benchmark::Counter(2 * cca_conv_flops(B * T, d) * 1e-9 * st.iterations(), benchmark::Counter::kIsRate);
}
void cca_args(benchmark::internal::Benchmark* b) {
  for (int64_t T : {int64_t{1024}, int64_t{4096}, kBeyondCacheT * 8 / 5}) b->Args({1, T, 128, 8, 2});
  b->Args({8, 256, 64, 4, 2});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_CcaConvForward)->Apply(cca_args);
BENCHMARK(BM_CcaConvBackward)->Apply(cca_args);

// The CCA q/k path after the conv (mean skip, QK norm, RoPE, fused per token) and its backward.
// Args: B, T, hd, nq, nkv. GB/s counts the tensors each pass reads and writes once.
void BM_CcaQkForward(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1), N = B * T;
  ops::CcaDims d{st.range(3), st.range(4), st.range(2)};
  const int64_t C = d.channels(), rq = d.nq * d.hd, rk = d.nkv * d.hd;
  ops::RopeTable tab = ops::make_rope_table(d.hd, 0.5, 1e4, T);
  Tensor conv = rnd({N, C}, 1), z = rnd({N, C}, 2), temp = rnd({d.nkv}, 3);
  Tensor q = zeros({N, rq}), k = zeros({N, rk}), qpre = zeros({N, rq}), kpre = zeros({N, rk});
  for (auto _ : st) ops::cca_qk_forward(q, k, qpre, kpre, conv, z, temp, tab, B, T, d);
  st.counters["GB/s"] = benchmark::Counter(4.0 * N * C * 4 * st.iterations() * 1e-9, benchmark::Counter::kIsRate);
}
void BM_CcaQkBackward(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1), N = B * T;
  ops::CcaDims d{st.range(3), st.range(4), st.range(2)};
  const int64_t C = d.channels(), rq = d.nq * d.hd, rk = d.nkv * d.hd;
  ops::RopeTable tab = ops::make_rope_table(d.hd, 0.5, 1e4, T);
  Tensor dq = rnd({N, rq}, 1), dk = rnd({N, rk}, 2), qpre = rnd({N, rq}, 3), kpre = rnd({N, rk}, 4);
  Tensor temp = rnd({d.nkv}, 5), dconv = zeros({N, C}), dz = zeros({N, C}), dtemp = zeros({d.nkv});
  for (auto _ : st) ops::cca_qk_backward(dconv, dz, dtemp, dq, dk, qpre, kpre, temp, tab, B, T, d);
  st.counters["GB/s"] = benchmark::Counter(4.0 * N * C * 4 * st.iterations() * 1e-9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CcaQkForward)->Args({8, 256, 64, 4, 2})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_CcaQkBackward)->Args({8, 256, 64, 4, 2})->Unit(benchmark::kMicrosecond)->UseRealTime();

// RoPE in place on q [T, 8, 128] (half the dims rotate; all bytes are read and written).
void BM_Rope(benchmark::State& st) {
  const int64_t B = 1, T = st.range(0), H = 8, hd = 128;
  ops::RopeTable tab = ops::make_rope_table(hd, 0.5, 5e6, T);
  Tensor x = rnd({B, T, H, hd}, 1);
  for (auto _ : st) ops::rope_forward(x, x, tab, B, T, H, hd);
  st.counters["GB/s"] = benchmark::Counter(2.0 * x.nbytes() * st.iterations() * 1e-9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Rope)->Arg(1024)->Arg(4096)->Arg(kBeyondCacheT * 2)->Unit(benchmark::kMicrosecond)->UseRealTime();

// MoE gather + weighted unpermute of N tokens × H = 2048 over 16 experts (+ skip).
void BM_MoePermute(benchmark::State& st) {
  const int64_t N = st.range(0), H = 2048, E = 16;
  Tensor logits = rnd({N, E + 1}, 1), beta = Tensor::zeros({E + 1}, DType::f32);
  Tensor probs = Tensor::empty({N, E + 1}, DType::f32), choice = Tensor::empty({N}, DType::i32);
  Tensor weight = Tensor::empty({N}, DType::f32);
  ops::moe_route(probs, choice, weight, logits, beta, N, E);
  Tensor counts = Tensor::empty({E}, DType::i32), offsets = Tensor::empty({E + 1}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32), src = Tensor::empty({N}, DType::i32);
  const int64_t M = ops::moe_plan(counts, offsets, pos, src, choice, N, E);
  Tensor x = rnd({N, H}, 2), xp = zeros({N, H}), out = zeros({N, H});
  for (auto _ : st) {
    ops::moe_gather(xp, x, src, M, N, H);
    ops::moe_unpermute(out, xp, weight, pos, M, N, H);
  }
  st.counters["GB/s"] = benchmark::Counter((2.0 * M + M + N) * H * 4 * st.iterations() * 1e-9,
                                           benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MoePermute)->Arg(4096)->Arg(kBeyondCacheT)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
