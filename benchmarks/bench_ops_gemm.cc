// GEMM throughput (FLOP/s of wall-clock time: with several threads the main thread's CPU time
// understates what the call takes) for the model's own shapes, f32 and bf16, next to square GEMMs
// of similar FLOPs as the library's reference point. Shapes: y = x·Wᵀ, x [M, K] tokens, W [N, K] (HF layout).
//   ./bench_ops_gemm --benchmark_min_time=0.05s       (quick check)
//   ./bench_ops_gemm --benchmark_filter=zaya1          (one model's shapes)
//   ./bench_ops_gemm --benchmark_filter=vs_square      (each model GEMM alternated with its square)
#include <benchmark/benchmark.h>

#include <chrono>
#include <immintrin.h>

#include <cmath>
#include <string>
#include <vector>

#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/amx_gemm.h"
#include "zaya/ops/cpu/gemm_cpu.h"
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
  ops::gemm(y, x, Trans::N, w, Trans::T);  // builds and caches the primitive outside the timing
  for (auto _ : state) {
    ops::gemm(y, x, Trans::N, w, Trans::T);
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

// One grouped expert GEMM of the benchmarks: all experts' tokens in one [tokens, .] buffer (as
// the model keeps them), sliced per routing.
struct GroupedCall {
  int64_t tokens, experts, n, k;
  GroupedKind kind;
  Tensor a, x, w, out;
  Trans ta, tb;
  float beta;

  GroupedCall(int64_t tokens_, int64_t experts_, int64_t n_, int64_t k_, DType dt, GroupedKind kind_)
      : tokens(tokens_), experts(experts_), n(n_), k(k_), kind(kind_) {
    a = random_of({tokens, kind == GroupedKind::fwd ? k : n}, dt, 10);
    x = random_of({tokens, k}, dt, 11);  // dw's B
    w = random_of({experts, n, k}, dt, 3);
    out = Tensor::zeros(
        kind == GroupedKind::dw ? Shape{experts, n, k} : Shape{tokens, kind == GroupedKind::fwd ? n : k}, DType::f32);
    ta = kind == GroupedKind::dw ? Trans::T : Trans::N;
    tb = kind == GroupedKind::fwd ? Trans::T : Trans::N;
    beta = kind == GroupedKind::dw ? 1.0f : 0.0f;
  }
  std::vector<ops::GemmProblem> problems(uint64_t it) const {
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
  }
  void run(std::vector<ops::GemmProblem>& ps) const { ops::gemm_grouped(ps, ta, tb, 1.0f, beta); }
  double flops() const { return 2.0 * tokens * n * k; }  // Σ_e 2·M_e·N·K, the same for every routing
};

void bench_grouped(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k, DType dt,
                   GroupedKind kind) {
  GroupedCall g(tokens, experts, n, k, dt, kind);
  uint64_t it = 0;
  for (; it < 8; ++it) {  // warm-up: the routings' first builds are not timed
    auto ps = g.problems(it);
    g.run(ps);
  }
  ops::cpu::GemmCacheStats before = ops::cpu::gemm_cache_stats();
  for (auto _ : state) {
    state.PauseTiming();
    auto ps = g.problems(it++);
    state.ResumeTiming();
    g.run(ps);
  }
  ops::cpu::GemmCacheStats after = ops::cpu::gemm_cache_stats();
  set_flops(state, g.flops());
  state.counters["misses/iter"] = benchmark::Counter(static_cast<double>(after.misses - before.misses),
                                                     benchmark::Counter::kAvgIterations);
}

using clock_type = std::chrono::steady_clock;

// Runs a (call on the clock) and b alternately, the order flipping every iteration, so both see
// the same minute of this VM, whose speed drifts by up to 2× between benchmarks run minutes apart
// (even for the same code). prepare(it) runs off the clock before the pair. Seconds of each.
template <class Prepare, class A, class B>
void alternate(benchmark::State& state, Prepare prepare, A a, B b, double seconds[2]) {
  seconds[0] = seconds[1] = 0.0;
  uint64_t it = 8;
  for (auto _ : state) {
    prepare(it);
    for (int step = 0; step < 2; ++step) {
      const int which = (it & 1) ? step : 1 - step;
      auto t0 = clock_type::now();
      if (which == 0)
        a();
      else
        b();
      seconds[which] += std::chrono::duration<double>(clock_type::now() - t0).count();
    }
    ++it;
  }
}

// The same grouped call two ways on the same routings, call by call: use(true) and use(false) flip
// one of ops' switches between them. Counters: each way's GFLOP/s and the speedup of the first.
void bench_grouped_two_ways(benchmark::State& state, const GroupedCall& g, void (*use)(bool), const char* first,
                            const char* second) {
  for (uint64_t it = 0; it < 8; ++it)  // warm-up: both ways build their primitives
    for (bool on : {true, false}) {
      use(on);
      auto ps = g.problems(it);
      g.run(ps);
    }
  std::vector<ops::GemmProblem> ps;
  double seconds[2];
  alternate(
      state, [&](uint64_t it) { ps = g.problems(it); },
      [&] {
        use(true);
        g.run(ps);
      },
      [&] {
        use(false);
        g.run(ps);
      },
      seconds);
  use(true);
  const double flops = g.flops() * static_cast<double>(state.iterations());
  state.counters[str(first, "_GFLOP/s")] = flops / seconds[0] * 1e-9;
  state.counters[str(second, "_GFLOP/s")] = flops / seconds[1] * 1e-9;
  state.counters["speedup"] = seconds[1] / seconds[0];
}

// zaya's AMX kernel against oneDNN (bf16, small weights).
void bench_grouped_ab(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k,
                      GroupedKind kind) {
  bench_grouped_two_ways(state, GroupedCall(tokens, experts, n, k, DType::bf16, kind), ops::cpu::gemm_use_amx, "amx",
                         "onednn");
}

// Experts side by side (one whole GEMM per thread) against one after another on all threads
// (f32: bf16 with small weights takes the AMX kernel, which this does not affect).
void bench_grouped_split_ab(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k,
                            GroupedKind kind) {
  bench_grouped_two_ways(state, GroupedCall(tokens, experts, n, k, DType::f32, kind),
                         ops::cpu::gemm_grouped_side_by_side, "side", "serial");
}

// The bar as one measurement: a model GEMM against the library's square GEMM of the
// nearest FLOP count (log scale: 512, 1024 or 2048), alternated call by call. Counters: both
// rates and pct_of_square.
struct Square {
  int64_t n;
  Tensor x, w, y;
  Square(double flops, DType dt) {
    n = 512;
    for (int64_t c : {1024, 2048})
      if (std::fabs(std::log(flops / (2.0 * c * c * c))) < std::fabs(std::log(flops / (2.0 * n * n * n)))) n = c;
    x = random_of({n, n}, dt, 21);
    w = random_of({n, n}, dt, 22);
    y = Tensor::empty({n, n}, DType::f32);
    run();
  }
  void run() const { ops::gemm(y, x, Trans::N, w, Trans::T); }
  double flops() const { return 2.0 * n * n * n; }
};

void report_vs_square(benchmark::State& state, double flops, const Square& sq, const double seconds[2]) {
  const double iters = static_cast<double>(state.iterations());
  const double rate = flops * iters / seconds[0], sq_rate = sq.flops() * iters / seconds[1];
  state.counters["GFLOP/s"] = rate * 1e-9;
  state.counters["square"] = static_cast<double>(sq.n);
  state.counters["square_GFLOP/s"] = sq_rate * 1e-9;
  state.counters["pct_of_square"] = 100.0 * rate / sq_rate;
}

void bench_gemm_vs_square(benchmark::State& state, GemmShape s, DType dt) {
  Tensor x = random_of({s.m, s.k}, dt, 1), w = random_of({s.n, s.k}, dt, 2);
  Tensor y = Tensor::empty({s.m, s.n}, DType::f32);
  const double flops = 2.0 * s.m * s.n * s.k;
  Square sq(flops, dt);
  ops::gemm(y, x, Trans::N, w, Trans::T);
  double seconds[2];
  alternate(
      state, [](uint64_t) {}, [&] { ops::gemm(y, x, Trans::N, w, Trans::T); }, [&] { sq.run(); }, seconds);
  report_vs_square(state, flops, sq, seconds);
}

void bench_grouped_vs_square(benchmark::State& state, int64_t tokens, int64_t experts, int64_t n, int64_t k,
                             DType dt, GroupedKind kind) {
  GroupedCall g(tokens, experts, n, k, dt, kind);
  for (uint64_t it = 0; it < 8; ++it) {
    auto ps = g.problems(it);
    g.run(ps);
  }
  Square sq(g.flops(), dt);
  std::vector<ops::GemmProblem> ps;
  double seconds[2];
  alternate(
      state, [&](uint64_t it) { ps = g.problems(it); }, [&] { g.run(ps); }, [&] { sq.run(); }, seconds);
  report_vs_square(state, g.flops(), sq, seconds);
}

// zaya's AMX kernel alone on one product with every operand in cache (B packed once, the same A
// and C every call): the kernel's own ceiling, against which the grouped calls' rates (which
// stream their operands) can be read.
void bench_amx_hot(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  Tensor a = random_of({m, k}, DType::bf16, 31), w = random_of({n, k}, DType::bf16, 32);
  std::vector<bf16> packed(static_cast<size_t>(ops::cpu::amx_packed_b_elems(k, n)));
  std::vector<float> c(static_cast<size_t>(m * n));
  ops::cpu::amx_pack_b(packed.data(), w.data<bf16>(), k, k, n, true);
  for (auto _ : state) {
#pragma omp parallel num_threads(num_threads())
    {
      ops::cpu::amx_tile_begin();
      ops::cpu::amx_gemm(c.data(), n, a.data<bf16>(), k, packed.data(), m, n, k, false);
      ops::cpu::amx_tile_end();
    }
  }
  set_flops(state, 2.0 * m * n * k);
}

// The f32 floor of every GEMM here: each thread runs 12 independent AVX-512 FMA chains (enough to
// cover the FMA latency on two ports), so FLOP/s is the machine's fp32 FMA peak at the clock it
// holds under this load. 2 FLOPs × 16 lanes per FMA.
__attribute__((target("avx512f"))) void bench_fma_peak(benchmark::State& state) {
  constexpr int64_t kIters = 1 << 20;
  float sink = 0.0f;
  for (auto _ : state) {
#pragma omp parallel num_threads(num_threads()) reduction(+ : sink)
    {
      __m512 acc[12];
      for (int c = 0; c < 12; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
      const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
      for (int64_t it = 0; it < kIters; ++it)
        for (int c = 0; c < 12; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
      for (int c = 0; c < 12; ++c) sink += _mm512_cvtss_f32(acc[c]);  // keeps every chain live
    }
  }
  benchmark::DoNotOptimize(sink);
  set_flops(state, 2.0 * 16 * 12 * kIters * num_threads());
}

void register_all() {
  if (__builtin_cpu_supports("avx512f"))
    benchmark::RegisterBenchmark("fma_peak/f32", bench_fma_peak)->Unit(benchmark::kMillisecond)->UseRealTime();
  for (DType dt : {DType::f32, DType::bf16}) {
    // Names built with zaya::str: GCC 12 warns falsely (-Wrestrict) on chained std::string +.
    std::string_view d = dtype_name(dt);
    for (const GemmShape& s : model_shapes()) {
      benchmark::RegisterBenchmark(str("gemm/", s.name, "/", d).c_str(), bench_gemm, s, dt)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(str("gemm_vs_square/", s.name, "/", d).c_str(), bench_gemm_vs_square, s, dt)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    // Square references of 2·n³ FLOPs spanning the model shapes' range (0.27 to 26 GFLOP).
    if (dt == DType::bf16 && ops::cpu::amx_usable())
      benchmark::RegisterBenchmark("amx_kernel_hot/256x1024x256", bench_amx_hot, 256, 1024, 256)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
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
      // bf16 with small weights (the demo's), and every bf16 weight gradient, run zaya's AMX kernel
      // where the CPU has one (ops::cpu::gemm_use_amx); gemm_grouped_ab times it against oneDNN call by call.
      benchmark::RegisterBenchmark(str("gemm_grouped/", g.name, "/", d).c_str(), bench_grouped, g.tokens,
                                   g.experts, g.n, g.k, dt, g.kind)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(str("gemm_grouped_vs_square/", g.name, "/", d).c_str(), bench_grouped_vs_square,
                                   g.tokens, g.experts, g.n, g.k, dt, g.kind)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      if (dt == DType::bf16 && (g.n * g.k < (int64_t{1} << 20) || g.kind == GroupedKind::dw))
        benchmark::RegisterBenchmark(str("gemm_grouped_ab/", g.name, "/bf16").c_str(), bench_grouped_ab, g.tokens,
                                     g.experts, g.n, g.k, g.kind)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      if (dt == DType::f32)
        benchmark::RegisterBenchmark(str("gemm_grouped_split_ab/", g.name, "/f32").c_str(), bench_grouped_split_ab,
                                     g.tokens, g.experts, g.n, g.k, g.kind)
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
