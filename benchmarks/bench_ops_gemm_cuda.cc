// The CUDA GEMM ops at ZAYA1-base's training shapes (hidden 2048, 16 experts of ffn 2048, 4096
// tokens per micro-batch), through the op fronts (cuBLASLt behind them: ops/cuda/gemm.cu), in
// FLOP/s: the model's dense GEMMs, one expert's GEMMs alone, the 16 experts' grouped GEMMs and the
// whole experts forward and backward, next to a large square GEMM (the library's best case; the
// issue's goal is expert GEMMs at >= 60% of it). scripts/gpu_check.sh runs it on a lent GPU.
//   ./bench_ops_gemm_cuda --benchmark_min_time=0.2
// Each timed iteration queues kRepeat calls and waits for them (wall time), so the per-call host
// launch cost overlaps the GPU's work as in a training step. Without a GPU every case is skipped
// with the reason.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/random.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/gemm.h"

namespace {

using namespace zaya;
using zaya::ops::Trans;

constexpr int kRepeat = 20;
constexpr int64_t kTokens = 4096, kHidden = 2048, kExperts = 16, kFfn = 2048;

bool skip_without_gpu(benchmark::State& state) {
  if (cuda::device_count() > 0) return false;
  state.SkipWithError(("no CUDA device: " + cuda::no_device_reason()).c_str());
  return true;
}

// Normal(0, 1) entries drawn on the device (Philox), rounded to bf16 there where asked.
Tensor random_on_gpu(const Shape& s, DType dt, uint64_t seed) {
  Tensor f = Tensor::empty(s, DType::f32, Device::cuda);
  fill_normal(f, seed, 0, 0.0f, 1.0f);
  if (dt == DType::f32) return f;
  Tensor b = Tensor::empty(s, DType::bf16, Device::cuda);
  ops::cast_to_bf16(b, f);
  return b;
}

// Times `run` (kRepeat calls queued, then one wait) and reports flops_per_call per call.
template <class Run>
void time_calls(benchmark::State& state, double flops_per_call, Run&& run) {
  cuda::DeviceContext& ctx = cuda::current();
  run();  // plans built and workspaces allocated outside the timing
  ctx.synchronize();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kRepeat; ++r) run();
    ctx.synchronize();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["FLOP/s"] = benchmark::Counter(flops_per_call * kRepeat, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

// y [m, n] = x [m, k]·Wᵀ (W [n, k], the HF layout).
void bench_gemm(benchmark::State& state, int64_t m, int64_t n, int64_t k, DType dt) {
  if (skip_without_gpu(state)) return;
  Tensor x = random_on_gpu({m, k}, dt, 1), w = random_on_gpu({n, k}, dt, 2);
  Tensor y = Tensor::empty({m, n}, DType::f32, Device::cuda);
  time_calls(state, 2.0 * m * n * k, [&] { ops::gemm(y, x, Trans::N, w, Trans::T); });
}

// The experts' four GEMM kinds as grouped calls over 16 experts, balanced (256 rows each) or
// uneven (shares between 0.25× and 1.75× the mean, a fixed pattern).
std::vector<int64_t> expert_offsets(bool uneven) {
  std::vector<int64_t> off(kExperts + 1, 0);
  double total = 0, acc = 0;
  std::vector<double> w(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) total += w[e] = uneven ? 0.25 + 1.5 * static_cast<double>((e * 7) % 16) / 15 : 1.0;
  for (int64_t e = 0; e < kExperts; ++e) {
    acc += w[e];
    off[e + 1] = e + 1 == kExperts ? kTokens : static_cast<int64_t>(kTokens * acc / total);
  }
  return off;
}

enum class Kind { gate_up, down, dx_gate_up, dw_gate_up };

void bench_expert_grouped(benchmark::State& state, Kind kind, bool uneven, DType dt) {
  if (skip_without_gpu(state)) return;
  const std::vector<int64_t> off = expert_offsets(uneven);
  // gate_up: [rows, H]·W_gu[e]ᵀ (W_gu [2I, H]); down: [rows, I]·W_d[e]ᵀ (W_d [H, I]);
  // dx of gate_up: dgu [rows, 2I]·W_gu[e]; dW of gate_up: W_gu[e] += dguᵀ·xp.
  const int64_t n = kind == Kind::down ? kHidden : 2 * kFfn, k = kind == Kind::down ? kFfn : kHidden;
  Tensor w = random_on_gpu({kExperts, n, k}, dt, 3);
  Tensor a = random_on_gpu({kTokens, kind == Kind::gate_up || kind == Kind::down ? k : n}, dt, 4);
  Tensor x = random_on_gpu({kTokens, k}, dt, 5);
  Tensor out = kind == Kind::dw_gate_up ? Tensor::zeros({kExperts, n, k}, DType::f32, Device::cuda)
                                        : Tensor::empty({kTokens, kind == Kind::dx_gate_up ? k : n}, DType::f32, Device::cuda);
  std::vector<ops::GemmProblem> ps;
  for (int64_t e = 0; e < kExperts; ++e) {
    Tensor ae = a.slice(off[e], off[e + 1]);
    if (kind == Kind::dw_gate_up)
      ps.push_back({ae, x.slice(off[e], off[e + 1]), out.select(e)});
    else
      ps.push_back({ae, w.select(e), out.slice(off[e], off[e + 1])});
  }
  const Trans ta = kind == Kind::dw_gate_up ? Trans::T : Trans::N;
  const Trans tb = kind == Kind::gate_up || kind == Kind::down ? Trans::T : Trans::N;
  const float beta = kind == Kind::dw_gate_up ? 1.0f : 0.0f;
  time_calls(state, 2.0 * kTokens * n * k, [&] { ops::gemm_grouped(ps, ta, tb, 1.0f, beta); });
}

// The whole experts op (gather, gate_up, SwiGLU, down; and its backward), every token routed.
struct ExpertsCase {
  Tensor x, src, offsets, dy, dxp;
  ops::ExpertWeights w, g;
  ops::ExpertActs a;
  ops::ExpertScratch s;
};

ExpertsCase make_experts(bool uneven, DType dt) {
  auto z = [](const Shape& s, DType t = DType::f32) { return Tensor::zeros(s, t, Device::cuda); };
  ExpertsCase c;
  const bool b16 = dt == DType::bf16;
  c.x = random_on_gpu({kTokens, kHidden}, DType::f32, 6);
  Tensor src = Tensor::empty({kTokens}, DType::i32), off = Tensor::empty({kExperts + 1}, DType::i32);
  for (int64_t i = 0; i < kTokens; ++i) src.data<int32_t>()[i] = static_cast<int32_t>((i * 97) % kTokens);
  const std::vector<int64_t> o = expert_offsets(uneven);
  for (int64_t e = 0; e <= kExperts; ++e) off.data<int32_t>()[e] = static_cast<int32_t>(o[e]);
  c.src = src.to(Device::cuda);
  c.offsets = off.to(Device::cuda);
  c.w = {random_on_gpu({kExperts, 2 * kFfn, kHidden}, dt, 7), random_on_gpu({kExperts, kHidden, kFfn}, dt, 8)};
  c.g = {z({kExperts, 2 * kFfn, kHidden}), z({kExperts, kHidden, kFfn})};
  c.a = {z({kTokens, kHidden}), z({kTokens, 2 * kFfn}), z({kTokens, kFfn}), z({kTokens, kHidden}),
         b16 ? z({kTokens, kHidden}, DType::bf16) : Tensor{}, b16 ? z({kTokens, kFfn}, DType::bf16) : Tensor{}};
  c.s = {z({kTokens, kFfn}), z({kTokens, 2 * kFfn}), b16 ? z({kTokens, kHidden}, DType::bf16) : Tensor{},
         b16 ? z({kTokens, 2 * kFfn}, DType::bf16) : Tensor{}};
  c.dy = random_on_gpu({kTokens, kHidden}, DType::f32, 9);
  c.dxp = z({kTokens, kHidden});
  return c;
}

// Forward: 2·tokens·(2I·H + H·I) FLOP; backward twice that (input and weight gradients).
constexpr double kExpertsForwardFlops = 2.0 * kTokens * (2 * kFfn * kHidden + kHidden * kFfn);

void bench_experts_forward(benchmark::State& state, bool uneven, DType dt) {
  if (skip_without_gpu(state)) return;
  ExpertsCase c = make_experts(uneven, dt);
  time_calls(state, kExpertsForwardFlops, [&] { ops::experts_forward(c.a, c.x, c.src, c.offsets, c.w, kTokens); });
}

void bench_experts_backward(benchmark::State& state, bool uneven, DType dt) {
  if (skip_without_gpu(state)) return;
  ExpertsCase c = make_experts(uneven, dt);
  ops::experts_forward(c.a, c.x, c.src, c.offsets, c.w, kTokens);
  time_calls(state, 2 * kExpertsForwardFlops,
             [&] { ops::experts_backward(c.dxp, c.g, c.dy, c.offsets, c.w, c.a, c.s, kTokens, {}); });
}

void register_all() {
  for (DType dt : {DType::bf16, DType::f32}) {
    const std::string d = dt == DType::bf16 ? "bf16" : "f32";
    auto reg = [](const std::string& name, auto fn) {
      benchmark::RegisterBenchmark(name.c_str(), fn)->UseManualTime()->Unit(benchmark::kMicrosecond);
    };
    reg("gemm/" + d + "/square_8192", [dt](benchmark::State& s) { bench_gemm(s, 8192, 8192, 8192, dt); });
    reg("gemm/" + d + "/zaya1_qkv_proj", [dt](benchmark::State& s) { bench_gemm(s, kTokens, 1024 + 256 + 256, kHidden, dt); });
    reg("gemm/" + d + "/zaya1_o_proj", [dt](benchmark::State& s) { bench_gemm(s, kTokens, kHidden, 1024, dt); });
    reg("gemm/" + d + "/zaya1_lm_head_chunk", [dt](benchmark::State& s) { bench_gemm(s, kTokens, 8192, kHidden, dt); });
    reg("gemm/" + d + "/zaya1_expert_gate_up_one", [dt](benchmark::State& s) { bench_gemm(s, kTokens / kExperts, 2 * kFfn, kHidden, dt); });
    reg("gemm/" + d + "/zaya1_expert_down_one", [dt](benchmark::State& s) { bench_gemm(s, kTokens / kExperts, kHidden, kFfn, dt); });
    for (bool uneven : {false, true}) {
      const std::string r = uneven ? "/uneven" : "/balanced";
      reg("experts_grouped/" + d + "/gate_up" + r, [=](benchmark::State& s) { bench_expert_grouped(s, Kind::gate_up, uneven, dt); });
      reg("experts_grouped/" + d + "/down" + r, [=](benchmark::State& s) { bench_expert_grouped(s, Kind::down, uneven, dt); });
      reg("experts_grouped/" + d + "/dx_gate_up" + r, [=](benchmark::State& s) { bench_expert_grouped(s, Kind::dx_gate_up, uneven, dt); });
      reg("experts_grouped/" + d + "/dw_gate_up" + r, [=](benchmark::State& s) { bench_expert_grouped(s, Kind::dw_gate_up, uneven, dt); });
      reg("experts/" + d + "/forward" + r, [=](benchmark::State& s) { bench_experts_forward(s, uneven, dt); });
      reg("experts/" + d + "/backward" + r, [=](benchmark::State& s) { bench_experts_backward(s, uneven, dt); });
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
