// GEMM throughput (FLOP/s of wall-clock time: with several threads the main thread's CPU time
// understates what the call takes) for the model's own shapes, f32 and bf16, next to square GEMMs
// of similar FLOPs as the library's reference point. Shapes: y = x·Wᵀ, x [M, K] tokens, W [N, K] (HF layout).
//   ./bench_ops_gemm --benchmark_min_time=0.05s       (quick check)
//   ./bench_ops_gemm --benchmark_filter=zaya1          (one model's shapes)
#include <benchmark/benchmark.h>

#include <chrono>

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
  state.counters["FLOP/s"] = benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
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

// The expert GEMMs as grouped calls with uneven routing that changes every iteration, as it does
// every training step: iteration i splits `tokens` over the experts with shares drawn from a
// fixed hash of i (each expert between 0.25× and 1.75× the mean), so the timings are repeatable
// and a GEMM library that builds per token count pays for it here as it would in training. The
// `misses/iter` counter is the primitive builds per iteration, after a warm-up of 8 routings.
//   kind fwd:  y_e = x_e·W_eᵀ     (A [M_e, K] tokens, B = W_e [N, K])         — gate_up / down
//   kind dx:   dx_e = dy_e·W_e    (A [M_e, N] tokens, B = W_e [N, K])         — input gradient
//   kind dw:   dW_e += dy_eᵀ·x_e  (A [M_e, N], B [M_e, K]; tokens are the reduction dim)
enum class GroupedKind { fwd, dx, dw };

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer: a fixed, well-spread hash
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Row offsets of each expert's tokens for routing number `it` (offsets[e] .. offsets[e + 1]).
std::vector<int64_t> routing(uint64_t it, int64_t tokens, int64_t experts) {
  std::vector<double> w(experts);
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) {
    uint64_t h = mix64(it * 1000003ull + static_cast<uint64_t>(e));
    w[e] = 0.25 + 1.5 * static_cast<double>(h >> 11) / 9007199254740992.0;  // [0.25, 1.75)
    total += w[e];
  }
  std::vector<int64_t> off(experts + 1, 0);
  double acc = 0;
  for (int64_t e = 0; e < experts; ++e) {
    acc += w[e];
    off[e + 1] = e + 1 == experts ? tokens : static_cast<int64_t>(tokens * acc / total);
  }
  return off;
}

void bench_grouped(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k, DType dt,
                   GroupedKind kind) {
  // All experts' tokens in one [tokens, .] buffer (as the model keeps them), sliced per routing.
  const int64_t in_cols = kind == GroupedKind::fwd ? k : n;  // A's columns
  Tensor a = random_of({tokens, in_cols}, dt, 10);
  Tensor x = random_of({tokens, k}, dt, 11);  // dw's B
  Tensor w = random_of({experts, n, k}, dt, 3);
  Tensor out = Tensor::zeros(
      kind == GroupedKind::dw ? Shape{experts, n, k} : Shape{tokens, kind == GroupedKind::fwd ? n : k},
      DType::f32);
  const Trans ta = kind == GroupedKind::dw ? Trans::T : Trans::N;
  const Trans tb = kind == GroupedKind::fwd ? Trans::T : Trans::N;
  const float beta = kind == GroupedKind::dw ? 1.0f : 0.0f;
  auto problems_for = [&](uint64_t it) {
    std::vector<int64_t> off = routing(it, tokens, experts);
    std::vector<ops::GemmProblem> ps;
    for (int64_t e = 0; e < experts; ++e) {
      Tensor ae = a.slice(off[e], off[e + 1]);
      if (kind == GroupedKind::dw)
        ps.push_back({ae, x.slice(off[e], off[e + 1]), out.select(e)});
      else
        ps.push_back({ae, w.select(e), out.slice(off[e], off[e + 1])});
    }
    return ps;
  };
  uint64_t it = 0;
  for (; it < 8; ++it) {  // warm-up: the routings' first builds are not timed
    auto ps = problems_for(it);
    ops::gemm_grouped(ps, ta, tb, 1.0f, beta);
  }
  ops::GemmCacheStats before = ops::gemm_cache_stats();
  for (auto _ : state) {
    state.PauseTiming();
    auto ps = problems_for(it++);
    state.ResumeTiming();
    ops::gemm_grouped(ps, ta, tb, 1.0f, beta);
  }
  ops::GemmCacheStats after = ops::gemm_cache_stats();
  set_flops(state, 2.0 * tokens * n * k);  // Σ_e 2·M_e·N·K, the same for every routing
  state.counters["misses/iter"] = benchmark::Counter(static_cast<double>(after.misses - before.misses),
                                                     benchmark::Counter::kAvgIterations);
}

// The same grouped call through zaya's AMX kernel and through oneDNN, alternating call by call on
// the same routings, so both see the same minute of this VM (whose speed drifts by up to 2×
// between benchmarks run minutes apart). Counters: each path's GFLOP/s and amx/onednn speedup.
void bench_grouped_ab(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k,
                      GroupedKind kind) {
  const int64_t in_cols = kind == GroupedKind::fwd ? k : n;
  Tensor a = random_of({tokens, in_cols}, DType::bf16, 10);
  Tensor x = random_of({tokens, k}, DType::bf16, 11);
  Tensor w = random_of({experts, n, k}, DType::bf16, 3);
  Tensor out = Tensor::zeros(
      kind == GroupedKind::dw ? Shape{experts, n, k} : Shape{tokens, kind == GroupedKind::fwd ? n : k},
      DType::f32);
  const Trans ta = kind == GroupedKind::dw ? Trans::T : Trans::N;
  const Trans tb = kind == GroupedKind::fwd ? Trans::T : Trans::N;
  const float beta = kind == GroupedKind::dw ? 1.0f : 0.0f;
  auto problems_for = [&](uint64_t it) {
    std::vector<int64_t> off = routing(it, tokens, experts);
    std::vector<ops::GemmProblem> ps;
    for (int64_t e = 0; e < experts; ++e) {
      Tensor ae = a.slice(off[e], off[e + 1]);
      if (kind == GroupedKind::dw)
        ps.push_back({ae, x.slice(off[e], off[e + 1]), out.select(e)});
      else
        ps.push_back({ae, w.select(e), out.slice(off[e], off[e + 1])});
    }
    return ps;
  };
  using clock = std::chrono::steady_clock;
  double seconds[2] = {0, 0};
  uint64_t it = 0;
  for (; it < 8; ++it)
    for (bool amx : {true, false}) {
      ops::gemm_use_amx(amx);
      auto ps = problems_for(it);
      ops::gemm_grouped(ps, ta, tb, 1.0f, beta);
    }
  for (auto _ : state) {
    auto ps = problems_for(it++);
    for (int path = 0; path < 2; ++path) {  // 0: AMX, 1: oneDNN; the order flips every iteration
      const int p = (it & 1) ? path : 1 - path;
      ops::gemm_use_amx(p == 0);
      auto t0 = clock::now();
      ops::gemm_grouped(ps, ta, tb, 1.0f, beta);
      seconds[p] += std::chrono::duration<double>(clock::now() - t0).count();
    }
  }
  ops::gemm_use_amx(true);
  const double flops = 2.0 * tokens * n * k * static_cast<double>(state.iterations());
  state.counters["amx_GFLOP/s"] = flops / seconds[0] * 1e-9;
  state.counters["onednn_GFLOP/s"] = flops / seconds[1] * 1e-9;
  state.counters["speedup"] = seconds[1] / seconds[0];
}

void register_all() {
  for (DType dt : {DType::f32, DType::bf16}) {
    // Names built with zaya::str: GCC 12 warns falsely (-Wrestrict) on chained std::string +.
    std::string_view d = dtype_name(dt);
    for (const GemmShape& s : model_shapes())
      benchmark::RegisterBenchmark(str("gemm/", s.name, "/", d).c_str(), bench_gemm, s, dt)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    // Square references of 2·n³ FLOPs spanning the model shapes' range (0.27 to 26 GFLOP).
    for (int64_t n : {512, 1024, 2048})
      benchmark::RegisterBenchmark(str("gemm/square/", n, "/", d).c_str(), bench_gemm,
                                   GemmShape{"square", n, n, n}, dt)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    // Grouped expert GEMMs: demo 2,048 tokens over 8 experts (H 256, I 512), ZAYA1 4,096 over 16
    // (H 2048, I 2048); gate_up forward, and the down projection's input and weight gradients.
    struct G {
      const char* name;
      int64_t tokens, experts, n, k;
      GroupedKind kind;
    };
    for (G g : {G{"demo/expert_gate_up", 2048, 8, 1024, 256, GroupedKind::fwd},
                G{"demo/expert_down_dx", 2048, 8, 256, 512, GroupedKind::dx},
                G{"demo/expert_down_dw", 2048, 8, 256, 512, GroupedKind::dw},
                G{"zaya1/expert_gate_up", 4096, 16, 4096, 2048, GroupedKind::fwd},
                G{"zaya1/expert_down_dx", 4096, 16, 2048, 2048, GroupedKind::dx},
                G{"zaya1/expert_down_dw", 4096, 16, 2048, 2048, GroupedKind::dw}}) {
      // bf16 with small weights (the demo's) runs zaya's AMX kernel where the CPU has one
      // (ops::gemm_use_amx); gemm_grouped_ab times it against oneDNN call by call.
      benchmark::RegisterBenchmark(str("gemm_grouped/", g.name, "/", d).c_str(), bench_grouped, g.tokens,
                                   g.experts, g.n, g.k, dt, g.kind)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      if (dt == DType::bf16 && g.n * g.k < (int64_t{1} << 20))
        benchmark::RegisterBenchmark(str("gemm_grouped_ab/", g.name, "/bf16").c_str(), bench_grouped_ab, g.tokens,
                                     g.experts, g.n, g.k, g.kind)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
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
