// The CUDA MoE routing/permutation kernels and the cross-entropy's row kernels in bytes/s (bytes
// each op must read + write, counted once), next to a device-to-device copy of 1 GiB as the
// ceiling; the fused tied-head cross-entropy in FLOP/s (forward: 1 GEMM-equivalent 2·N·V·H;
// forward + backward: 4, the chunk's logits made again before its two gradient GEMMs). ZAYA1-base's
// training shapes: 4,096 tokens, hidden 2048, 16 experts, vocabulary 262,272.
//   ./bench_ops_moe_loss_cuda --benchmark_min_time=0.2s
// Each timing is the wall time of a batch of launches up to a stream synchronize, over the batch
// (the ops never synchronize themselves, except moe_plan and the loss forwards, which return a
// value to the host). Without a GPU every benchmark reports an error saying so.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/random.h"
#include "zaya/ops/loss.h"
#include "zaya/ops/moe.h"

namespace {

using namespace zaya;

constexpr int64_t kTokens = 4096, kHidden = 2048, kExperts = 16, kVocab = 262272;
constexpr int kBatch = 20;  // launches per timed batch

bool skip_without_gpu(benchmark::State& state) {
  if (cuda::device_count() > 0) return false;
  state.SkipWithError(("no CUDA device: " + cuda::no_device_reason()).c_str());
  return true;
}

Tensor randn_gpu(const Shape& s, uint64_t seed, float scale = 1.0f) {  // drawn on the device (Philox)
  Tensor t = Tensor::empty(s, DType::f32, Device::cuda);
  fill_normal(t, seed, 0, 0.0f, scale);
  return t;
}
Tensor gpu(const Shape& s, DType d = DType::f32) { return Tensor::zeros(s, d, Device::cuda); }

// Times `op` in batches of kBatch calls, each batch ended by a synchronize; bytes per call.
template <class Op>
void run_batches(benchmark::State& state, int64_t bytes_per_call, Op op) {
  auto& ctx = cuda::current();
  op();  // warm: first-use allocations, module loading
  ctx.synchronize();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) op();
    ctx.synchronize();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                           kBatch);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes_per_call);
}

// A routed layer: router logits, the route, the plan (M ≈ 16/17 of the tokens: the skip class wins
// about as often as any expert).
struct Routed {
  Tensor logits, beta, probs, choice, weight, counts, offsets, pos, src;
  int64_t M = 0;
};
Routed routed_layer() {
  const int64_t N = kTokens, E = kExperts;
  Routed r{randn_gpu({N, E + 1}, 1, 2.0f),
           gpu({E + 1}),
           gpu({N, E + 1}),
           gpu({N}, DType::i32),
           gpu({N}),
           gpu({E}, DType::i32),
           gpu({E + 1}, DType::i32),
           gpu({N}, DType::i32),
           gpu({N}, DType::i32)};
  ops::moe_route(r.probs, r.choice, r.weight, r.logits, r.beta, N, E);
  r.M = ops::moe_plan(r.counts, r.offsets, r.pos, r.src, r.choice, N, E);
  return r;
}

void BM_cuda_copy_reference(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = gpu({n}), b = gpu({n});
  auto& ctx = cuda::current();  // on the ops' stream, unsynchronized like them (cuda::copy waits per call)
  run_batches(state, 2 * n * 4, [&] { ctx.copy_async(b.raw(), Device::cuda, a.raw(), Device::cuda, n * 4); });
}

void BM_cuda_moe_route(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  const int64_t N = kTokens, K = kExperts + 1;
  run_batches(state, N * K * 4 * 2 + N * 8,
              [&] { ops::moe_route(r.probs, r.choice, r.weight, r.logits, r.beta, N, kExperts); });
}

void BM_cuda_moe_route_backward(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  const int64_t N = kTokens, K = kExperts + 1;
  Tensor dweight = randn_gpu({N}, 2), dlogits = gpu({N, K});
  run_batches(state, N * K * 4 * 2 + N * 8,
              [&] { ops::moe_route_backward(dlogits, dweight, r.probs, r.choice, N, kExperts); });
}

void BM_cuda_moe_plan(benchmark::State& state) {  // includes its synchronize and M's copy to the host
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  run_batches(state, kTokens * 4 * 3,
              [&] { ops::moe_plan(r.counts, r.offsets, r.pos, r.src, r.choice, kTokens, kExperts); });
}

void BM_cuda_moe_gather(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  Tensor x = randn_gpu({kTokens, kHidden}, 3), xp = gpu({kTokens, kHidden});
  run_batches(state, r.M * kHidden * 4 * 2, [&] { ops::moe_gather(xp, x, r.src, r.M, kTokens, kHidden); });
}

void BM_cuda_moe_gather_backward(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  Tensor dxp = randn_gpu({kTokens, kHidden}, 4), dx = gpu({kTokens, kHidden});
  run_batches(state, (r.M + kTokens) * kHidden * 4,
              [&] { ops::moe_gather_backward(dx, dxp, r.pos, r.M, kTokens, kHidden); });
}

void BM_cuda_moe_unpermute(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  Tensor y = randn_gpu({kTokens, kHidden}, 5), out = gpu({kTokens, kHidden});
  run_batches(state, (r.M + kTokens) * kHidden * 4,
              [&] { ops::moe_unpermute(out, y, r.weight, r.pos, r.M, kTokens, kHidden); });
}

void BM_cuda_moe_unpermute_backward(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Routed r = routed_layer();
  Tensor y = randn_gpu({kTokens, kHidden}, 6), dout = randn_gpu({kTokens, kHidden}, 7);
  Tensor dy = gpu({kTokens, kHidden}), dweight = gpu({kTokens});
  run_batches(state, 3 * r.M * kHidden * 4, [&] {
    ops::moe_unpermute_backward(dy, dweight, dout, y, r.weight, r.pos, r.M, kTokens, kHidden);
  });
}

// The row kernels alone, on one default chunk of logits [4096, 8192]: the forward reads it (twice:
// max, then Σexp; counted once), the backward reads and writes it.
constexpr int64_t kChunk = 8192;

Tensor chunk_targets() {
  Tensor t = Tensor::empty({kTokens}, DType::i32);
  for (int64_t i = 0; i < kTokens; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % kChunk);
  return t.to(Device::cuda);
}

void BM_cuda_xent_logits_forward(benchmark::State& state) {  // includes the loss's copy to the host
  if (skip_without_gpu(state)) return;
  Tensor logits = randn_gpu({kTokens, kChunk}, 8, 4.0f), lse = gpu({kTokens}), tg = chunk_targets();
  run_batches(state, kTokens * kChunk * 4, [&] { ops::cross_entropy_logits_forward(lse, logits, tg); });
}

void BM_cuda_xent_logits_backward(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor logits = randn_gpu({kTokens, kChunk}, 9, 4.0f), lse = gpu({kTokens}), tg = chunk_targets();
  const ops::CrossEntropyResult r = ops::cross_entropy_logits_forward(lse, logits, tg);
  // In place: later batches run on gradients instead of logits, which costs the kernel the same.
  run_batches(state, kTokens * kChunk * 4 * 2,
              [&] { ops::cross_entropy_logits_backward(logits, lse, tg, r.count); });
}

// The fused tied head at full size; arg 0 forward only, 1 forward + backward. f32 h and E.
void BM_cuda_cross_entropy_tied(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const bool backward = state.range(0) == 1;
  const ops::CrossEntropyOptions opt;
  Tensor h = randn_gpu({kTokens, kHidden}, 10, 1.0f), E = randn_gpu({kVocab, kHidden}, 11, 0.02f);
  Tensor t = Tensor::empty({kTokens}, DType::i32);
  for (int64_t i = 0; i < kTokens; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 104729) % kVocab);
  Tensor tg = t.to(Device::cuda), lse = gpu({kTokens});
  Tensor ws = gpu({ops::cross_entropy_workspace_elems(kTokens, kVocab, opt)});
  Tensor dh = backward ? gpu({kTokens, kHidden}) : Tensor{},
         dE = backward ? gpu({kVocab, kHidden}) : Tensor{};
  auto call = [&] {
    if (backward)
      ops::cross_entropy_tied_forward_backward(dh, dE, lse, h, E, tg, ws, opt);
    else
      ops::cross_entropy_tied_forward(lse, h, E, tg, ws, opt);
  };
  try {
    call();
  } catch (const Error& e) {  // ops::gemm without a CUDA kernel in this build
    state.SkipWithError(e.what());
    return;
  }
  auto& ctx = cuda::current();
  ctx.synchronize();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    ctx.synchronize();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double flops = (backward ? 4.0 : 1.0) * 2.0 * kTokens * static_cast<double>(kVocab) * kHidden;
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * static_cast<double>(state.iterations()) / 1e12, benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_cuda_copy_reference)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_route)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_route_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_plan)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_gather)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_gather_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_unpermute)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_moe_unpermute_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_xent_logits_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_xent_logits_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_cross_entropy_tied)
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

BENCHMARK_MAIN();
