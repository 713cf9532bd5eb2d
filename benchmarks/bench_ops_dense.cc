// Memory-bound ops in bytes/s (bytes each op must read + write, counted once) at sizes beyond the
// caches (STREAM's rule, read off the machine: stream_ref.h), next to a STREAM triad of the same
// array size measured in the same binary as the machine's ceiling; and the
// fused LM-head cross-entropy in FLOP/s (3 GEMM-equivalents: forward, recompute, two gradients = 4).
//   ./bench_ops_dense --benchmark_min_time=0.05s
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "stream_ref.h"
#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/dense_cpu.h"
#include "zaya/ops/cpu/loss_cpu.h"
#include "zaya/ops/cpu/newton_schulz_cpu.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/loss.h"
#include "zaya/ops/newton_schulz.h"
#include "zaya/ops/optim_ops.h"

namespace {

using namespace zaya;

// [kRows, 2048] f32 per tensor, kRows from the machine's caches (1.2 GiB per tensor on the
// development VM, whose L3 is 300 MiB): every op below streams each tensor from memory.
constexpr int64_t kCols = 2048;
const int64_t kRows = bench::stream_elems(kCols) / kCols;

Tensor randn(const Shape& s, uint64_t seed) { return bench::random_normal(s, seed); }

void set_bytes(benchmark::State& state, int64_t bytes_per_iter) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes_per_iter);
}

Tensor out(const Shape& s) { return bench::faulted_zeros(s); }

void BM_stream_triad(benchmark::State& state) { bench::stream_triad(state, kRows * kCols); }

void BM_rmsnorm_forward(benchmark::State& state) {
  Tensor x = randn({kRows, kCols}, 1), w = randn({kCols}, 2), y = out({kRows, kCols});
  Tensor rstd = out({kRows});
  for (auto _ : state) ops::rmsnorm_forward(y, rstd, x, w, 1e-5f);
  set_bytes(state, 2 * kRows * kCols * 4);  // x in, y out
}

void BM_rmsnorm_backward(benchmark::State& state) {
  Tensor x = randn({kRows, kCols}, 1), w = randn({kCols}, 2), g = randn({kRows, kCols}, 3);
  Tensor y = out({kRows, kCols}), rstd = out({kRows});
  Tensor dx = out({kRows, kCols}), dw = Tensor::zeros({kCols}, DType::f32);
  ops::rmsnorm_forward(y, rstd, x, w, 1e-5f);
  for (auto _ : state) ops::rmsnorm_backward(dx, dw, g, x, w, rstd);
  set_bytes(state, 3 * kRows * kCols * 4);  // dy, x in, dx out (dw accumulates in the same pass)
}

void BM_residual_scale_forward(benchmark::State& state) {
  Tensor h = randn({kRows, kCols}, 1), x = randn({kRows, kCols}, 2),
         y = out({kRows, kCols});
  ops::ResidualScaleParams p{randn({kCols}, 3), randn({kCols}, 4), randn({kCols}, 5), randn({kCols}, 6)};
  for (auto _ : state) ops::residual_scale_forward(y, h, x, p);
  set_bytes(state, 3 * kRows * kCols * 4);
}

void BM_residual_scale_backward(benchmark::State& state) {
  Tensor h = randn({kRows, kCols}, 1), x = randn({kRows, kCols}, 2), g = randn({kRows, kCols}, 3);
  Tensor dh = out({kRows, kCols}), dx = out({kRows, kCols});
  ops::ResidualScaleParams p{randn({kCols}, 3), randn({kCols}, 4), randn({kCols}, 5), randn({kCols}, 6)};
  ops::ResidualScaleParams gr{Tensor::zeros({kCols}, DType::f32), Tensor::zeros({kCols}, DType::f32),
                              Tensor::zeros({kCols}, DType::f32), Tensor::zeros({kCols}, DType::f32)};
  for (auto _ : state) ops::residual_scale_backward(dh, dx, gr, g, h, x, p);
  set_bytes(state, 5 * kRows * kCols * 4);  // dy, h, x in; dh, dx out
}

void BM_silu_forward(benchmark::State& state) {
  Tensor x = randn({kRows, kCols}, 1), y = out({kRows, kCols});
  for (auto _ : state) ops::silu_forward(y, x);
  set_bytes(state, 2 * kRows * kCols * 4);
}

// Arg: rows of kCols. kRows streams from memory (the bar); 8 rows (64 KiB each way) stay in L2 and
// show the arithmetic alone (items/s = elements per second).
void BM_gelu_forward(benchmark::State& state) {
  const int64_t rows = state.range(0);
  Tensor x = randn({rows, kCols}, 1), y = out({rows, kCols});
  for (auto _ : state) ops::gelu_forward(y, x);
  set_bytes(state, 2 * rows * kCols * 4);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows * kCols);
}

// Args: rows, and a shift added to the unit-normal inputs (0, or −30: the far tail, where the normal
// pdf φ in the gradient would be subnormal without the kernel's cut).
void BM_gelu_backward(benchmark::State& state) {
  const int64_t rows = state.range(0);
  Tensor x = randn({rows, kCols}, 1), dy = randn({rows, kCols}, 2), dx = out({rows, kCols});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += static_cast<float>(state.range(1));
  for (auto _ : state) ops::gelu_backward(dx, dy, x);
  set_bytes(state, 3 * rows * kCols * 4);  // dy, x in; dx out
}

// Arg 0: unit-normal gates; arg 1: gates shifted by −100 (a token with a massive activation: the
// far tail where σ would be subnormal).
Tensor swiglu_input(int64_t shift) {
  Tensor gu = randn({kRows, kCols}, 1);
  if (shift != 0)
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < kCols / 2; ++j) gu.data<float>()[r * kCols + j] -= 100.0f;
  return gu;
}

void BM_swiglu_forward(benchmark::State& state) {
  Tensor gu = swiglu_input(state.range(0)), y = out({kRows, kCols / 2});
  for (auto _ : state) ops::swiglu_forward(y, gu);
  set_bytes(state, (kRows * kCols + kRows * kCols / 2) * 4);
}

void BM_swiglu_backward(benchmark::State& state) {
  Tensor gu = swiglu_input(state.range(0)), dy = randn({kRows, kCols / 2}, 2), dgu = out({kRows, kCols});
  for (auto _ : state) ops::swiglu_backward(dgu, dy, gu);
  set_bytes(state, (2 * kRows * kCols + kRows * kCols / 2) * 4);  // gu, dy in; dgu out
}

// Arg 0: as the model calls it (streaming stores for an output beyond the caches); 1: plain stores.
void BM_softmax_forward(benchmark::State& state) {
  Tensor x = randn({kRows, kCols}, 1), y = out({kRows, kCols});
  const auto mode = state.range(0) ? ops::cpu::StoreMode::cached : ops::cpu::StoreMode::automatic;
  for (auto _ : state) ops::cpu::softmax_forward(y, x, mode);
  set_bytes(state, 2 * kRows * kCols * 4);
}

void BM_embedding_forward(benchmark::State& state) {
  const int64_t vocab = 8192;
  Tensor E = randn({vocab, kCols}, 1), y = out({kRows, kCols});
  Tensor ids = Tensor::empty({kRows}, DType::i32);
  for (int64_t i = 0; i < kRows; ++i)
    ids.data<int32_t>()[i] = static_cast<int32_t>((i * 2654435761u) % vocab);
  for (auto _ : state) ops::embedding_forward(y, ids, E);
  set_bytes(state, 2 * kRows * kCols * 4);
}

// Arg 0: random gradients from zero moments. Arg 1: the parameters no batch touches late in a
// run: gradient 0 and both moments decayed into float's subnormal range (1e-39, what ~700 steps of
// β1 = 0.9 leave of 1e-10), then one untimed step, then the timed one: the steady state of such
// parameters (refilled before every timed step).
void BM_adamw_update(benchmark::State& state) {
  const bool decayed = state.range(0) != 0;
  Tensor p = randn({kRows, kCols}, 1),
         g = decayed ? Tensor::zeros({kRows, kCols}, DType::f32) : randn({kRows, kCols}, 2);
  Tensor m = Tensor::zeros({kRows, kCols}, DType::f32), v = Tensor::zeros({kRows, kCols}, DType::f32);
  int64_t t = 0;
  for (auto _ : state) {
    if (decayed) {
      state.PauseTiming();
      m.fill_(1e-39);
      v.fill_(1e-39);
      ops::adamw_update(p, m, v, g, ops::AdamWHyper{}, ++t);
      state.ResumeTiming();
    }
    ops::adamw_update(p, m, v, g, ops::AdamWHyper{}, ++t);
  }
  set_bytes(state, 7 * kRows * kCols * 4);  // p, g, m, v in; p, m, v out
}

void BM_grad_norm(benchmark::State& state) {
  std::vector<Tensor> grads = {randn({kRows, kCols}, 1)};
  for (auto _ : state) benchmark::DoNotOptimize(ops::global_grad_norm(grads));
  set_bytes(state, kRows * kCols * 4);
}

// The demo's tied head and loss (2048 tokens, H 256, V 8192), forward and backward. Args: vocabulary
// chunk (4096: two chunks, logits recomputed; 8192: one chunk, exponentials kept), fused head on/off
// (the kept-exps case on AVX-512: the strip-layout kernels of ops/cpu/tied_head_cpu.h, or row-major
// logits and oneDNN).
void BM_cross_entropy_tied(benchmark::State& state) {
  const int64_t n = 2048, h = 256, vocab = 8192;
  ops::CrossEntropyOptions opt{.chunk = state.range(0)};
  ops::cpu::cross_entropy_use_fused_head(state.range(1) != 0);
  Tensor hid = randn({n, h}, 1), E = randn({vocab, h}, 2), dh = Tensor::empty({n, h}, DType::f32);
  Tensor dE = Tensor::zeros({vocab, h}, DType::f32), lse = Tensor::empty({n}, DType::f32);
  Tensor ws = Tensor::empty({ops::cross_entropy_workspace_elems(n, vocab, opt)}, DType::f32);
  Tensor tg = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) tg.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % vocab);
  for (auto _ : state) ops::cross_entropy_tied_forward_backward(dh, dE, lse, hid, E, tg, ws, opt);
  ops::cpu::cross_entropy_use_fused_head(true);
  // Three [N, V, H] products (the recomputing path runs a fourth, the logits again, not counted).
  state.counters["GFLOP/s"] =
      benchmark::Counter(3 * 2.0 * n * h * vocab * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_stream_triad)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_rmsnorm_forward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_rmsnorm_backward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_residual_scale_forward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_residual_scale_backward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_silu_forward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gelu_forward)->Arg(kRows)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gelu_backward)
    ->Args({kRows, 0})
    ->Args({kRows, -30})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_swiglu_forward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_swiglu_backward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_softmax_forward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_embedding_forward)->Unit(benchmark::kMillisecond)->UseRealTime();
// Muon's orthogonalization of one expert stack of the demo model, 5 steps, in FLOP/s: per step
// 4·r²·c + 2·r³ per matrix (X·Xᵀ, A·A, B·X), r ≤ c. Args: batch, rows, cols (the demo's gate_up
// [8, 1024, 256] and down [8, 256, 512] stacks); 1 to scale the stack's last matrix by 1e-20 (an
// expert no token has reached for ~900 steps, its momentum decayed by Muon's β = 0.95 per step);
// 0 for bf16 compute (the trainer's default), 1 for f32 (muon_ns_bf16 = false, and what bf16
// becomes on CPUs without native bf16 GEMMs); 0 for one batched call on all threads, 1 for the
// matrices side by side, one whole matrix per thread as the optimizer runs them
// (newton_schulz_orthogonalize_on_this_thread).
void BM_newton_schulz(benchmark::State& state) {
  const int64_t batch = state.range(0), rows = state.range(1), cols = state.range(2);
  const DType compute = state.range(4) != 0 ? DType::f32 : DType::bf16;
  const bool side_by_side = state.range(5) != 0;
  Tensor g = randn({batch, rows, cols}, 1), o = out({batch, rows, cols});
  if (state.range(3) != 0) ops::scale_inplace(g.select(batch - 1), 1e-20f);
  const int threads = omp_get_max_threads();
  const int64_t per = side_by_side ? ops::newton_schulz_workspace_elems(rows, cols, 1, compute) + 16
                                   : ops::newton_schulz_workspace_elems(rows, cols, batch, compute);
  Tensor ws = Tensor::zeros({side_by_side ? per * threads : per}, DType::f32);
  for (auto _ : state) {
    if (!side_by_side) {
      ops::newton_schulz_orthogonalize(o, g, ws, 5, compute);
      continue;
    }
#pragma omp parallel
    {
      const Tensor mine = ws.window(omp_get_thread_num() * per, Shape{per});
#pragma omp for schedule(dynamic, 1)
      for (int64_t e = 0; e < batch; ++e)
        ops::cpu::newton_schulz_orthogonalize_on_this_thread(o.select(e), g.select(e), mine, 5, compute);
    }
  }
  const double r = static_cast<double>(std::min(rows, cols)), c = static_cast<double>(std::max(rows, cols));
  const double flops = 5.0 * static_cast<double>(batch) * (4.0 * r * r * c + 2.0 * r * r * r);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

BENCHMARK(BM_adamw_update)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_newton_schulz)
    ->Args({8, 1024, 256, 0, 0, 0})
    ->Args({8, 1024, 256, 0, 0, 1})
    ->Args({8, 256, 512, 0, 0, 0})
    ->Args({8, 256, 512, 0, 0, 1})
    ->Args({8, 1024, 256, 1, 0, 1})
    ->Args({8, 1024, 256, 0, 1, 0})
    ->Args({8, 1024, 256, 0, 1, 1})
    ->Args({8, 1024, 256, 1, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_grad_norm)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cross_entropy_tied)
    ->Args({4096, 1})
    ->Args({8192, 0})
    ->Args({8192, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  zaya::set_num_threads(zaya::default_num_threads());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
