// GEMM throughput (FLOP/s) for the model's own shapes, f32 and bf16, next to square GEMMs of similar
// FLOPs as the library's reference point. Shapes: y = x·Wᵀ, x [M, K] tokens, W [N, K] (HF layout).
//   ./bench_ops_gemm --benchmark_min_time=0.05s       (quick check)
//   ./bench_ops_gemm --benchmark_filter=zaya1          (one model's shapes)
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/ops/gemm.h"

namespace {

using namespace zaya;
using zaya::ops::Trans;

struct GemmShape {
  std::string name;
  int64_t m, n, k;
};

// Demo model: H 256, nq 4, nkv 2, hd 64, I 512, E 8, R 64, V 8192, 8·256 = 2048 tokens per step.
// ZAYA1-base: H 2048, nq·hd 1024, nkv·hd 256, I 2048, E 16, R 256, 4096 tokens.
// Experts see tokens/E rows each when routing is balanced.
std::vector<GemmShape> model_shapes() {
  return {
      {"demo/qkv_proj", 2048, 256 + 128 + 128, 256},  // q, k, v_current + v_delayed
      {"demo/o_proj", 2048, 256, 256},
      {"demo/router_down", 2048, 64, 256},
      {"demo/expert_gate_up", 2048 / 8, 2 * 512, 256},
      {"demo/expert_down", 2048 / 8, 256, 512},
      {"demo/lm_head_chunk", 2048, 8192, 256},
      {"zaya1/qkv_proj", 4096, 1024 + 256 + 256, 2048},
      {"zaya1/o_proj", 4096, 2048, 1024},
      {"zaya1/router_down", 4096, 256, 2048},
      {"zaya1/expert_gate_up", 4096 / 16, 2 * 2048, 2048},
      {"zaya1/expert_down", 4096 / 16, 2048, 2048},
      {"zaya1/lm_head_chunk", 4096, 8192, 2048},
  };
}

Tensor random_of(const Shape& s, DType dt, uint64_t seed) {
  Tensor f = Tensor::empty(s, DType::f32);
  fill_normal(f, seed, 0, 0.0f, 1.0f);
  if (dt == DType::f32) return f;
  Tensor b = Tensor::empty(s, DType::bf16);
  for (int64_t i = 0; i < f.numel(); ++i) b.data<bf16>()[i] = to_bf16(f.data<float>()[i]);
  return b;
}

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void bench_gemm(benchmark::State& state, GemmShape s, DType dt) {
  Tensor x = random_of({s.m, s.k}, dt, 1), w = random_of({s.n, s.k}, dt, 2);
  Tensor y = Tensor::empty({s.m, s.n}, DType::f32);
  ops::gemm(x, Trans::N, w, Trans::T, y);  // builds and caches the primitive outside the timing
  for (auto _ : state) {
    ops::gemm(x, Trans::N, w, Trans::T, y);
    benchmark::DoNotOptimize(y.raw());
  }
  set_flops(state, 2.0 * s.m * s.n * s.k);
}

// The expert GEMMs as one grouped call with uneven routing (the load a real router produces).
void bench_grouped(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k, DType dt) {
  std::vector<int64_t> ms(experts);
  int64_t left = tokens;
  for (int64_t e = 0; e < experts; ++e) {  // shares 2:1 from first to last expert, summing to tokens
    ms[e] = e + 1 == experts ? left : tokens * (2 * experts - e) / (experts * (3 * experts + 1) / 2);
    left -= ms[e];
  }
  Tensor w = random_of({experts, n, k}, dt, 3);
  std::vector<ops::GemmProblem> problems;
  double flops = 0;
  for (int64_t e = 0; e < experts; ++e) {
    problems.push_back({random_of({ms[e], k}, dt, 10 + e), w.select(e), Tensor::empty({ms[e], n}, DType::f32)});
    flops += 2.0 * ms[e] * n * k;
  }
  ops::gemm_grouped(problems, Trans::N, Trans::T);
  for (auto _ : state) ops::gemm_grouped(problems, Trans::N, Trans::T);
  set_flops(state, flops);
}

void register_all() {
  for (DType dt : {DType::f32, DType::bf16}) {
    // Names built with zaya::str: GCC 12 warns falsely (-Wrestrict) on chained std::string +.
    std::string_view d = dtype_name(dt);
    for (const GemmShape& s : model_shapes())
      benchmark::RegisterBenchmark(str("gemm/", s.name, "/", d).c_str(), bench_gemm, s, dt)->Unit(benchmark::kMillisecond);
    // Square references of 2·n³ FLOPs spanning the model shapes' range (0.27 to 26 GFLOP).
    for (int64_t n : {512, 1024, 2048})
      benchmark::RegisterBenchmark(str("gemm/square/", n, "/", d).c_str(), bench_gemm,
                                   GemmShape{"square", n, n, n}, dt)
          ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(str("gemm_grouped/demo/expert_gate_up/", d).c_str(), bench_grouped, 2048, 8, 1024,
                                 256, dt)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(str("gemm_grouped/zaya1/expert_gate_up/", d).c_str(), bench_grouped, 4096, 16,
                                 4096, 2048, dt)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  zaya::set_num_threads(zaya::default_num_threads());
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
