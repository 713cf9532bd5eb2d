#include "zaya/bench/experts_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/core/tensor.h"
#include "zaya/ops/experts.h"

namespace zaya::bench {

void ExpertsBenchOptions::validate() const {
  ZAYA_CHECK(experts >= 1 && hidden >= 1 && intermediate >= 1,
             "--experts-tokens: the model's experts must have positive ", "E, H and I, found E ", experts,
             ", H ", hidden, ", I ", intermediate);
  ZAYA_CHECK(!tokens.empty(), "--experts-tokens: give at least one token count");
  for (int64_t t : tokens) ZAYA_CHECK(t >= 1, "--experts-tokens: token counts must be >= 1, found ", t);
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error("unsupported experts weight dtype", {.field = "--dtype", .expected = "f32 or bf16"});
  ZAYA_CHECK(warmup >= 0, "--warmup must be 0 or more, found ", warmup);
  ZAYA_CHECK(repeats >= 1, "--repeats must be at least 1, found ", repeats);
  ZAYA_CHECK(min_bytes > 0, "--experts-bytes must be positive, found ", min_bytes);
}

ExpertsBenchOptions experts_bench_options(const model::ModelConfig& c, std::vector<int64_t> tokens) {
  ExpertsBenchOptions o;
  o.experts = c.num_experts;
  o.hidden = c.hidden_size;
  o.intermediate = c.moe_intermediate_size;
  o.tokens = std::move(tokens);
  return o;
}

int64_t experts_bench_layers(const ExpertsBenchOptions& o) {
  const double layer = static_cast<double>(o.experts) * 3.0 * static_cast<double>(o.hidden) *
                       static_cast<double>(o.intermediate) * static_cast<double>(dtype_size(o.dtype));
  return std::max<int64_t>(2, static_cast<int64_t>(std::ceil(o.min_bytes / layer)));
}

std::vector<int64_t> round_robin_rows(int64_t tokens, int64_t experts, int64_t first) {
  std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
  for (int64_t t = 0; t < tokens; ++t) rows[static_cast<size_t>((first + t) % experts)] += 1;
  return rows;
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// A host tensor of uniform values in [-a, a], moved to `device`.
Tensor uniform_on(const Shape& s, DType dt, Device device, uint64_t seed, float a) {
  Tensor t = Tensor::empty(s, dt);
  fill_uniform(t, seed, 0, -a, a);
  return device == Device::cpu ? t : t.to(device);
}

// One routing of `tokens` rows: offsets [E+1] and src [tokens] (token indices in expert order).
struct Routing {
  Tensor offsets, src;
};
Routing make_routing(int64_t tokens, int64_t E, int64_t first, Device device) {
  const std::vector<int64_t> rows = round_robin_rows(tokens, E, first);
  Tensor off = Tensor::empty({E + 1}, DType::i32), src = Tensor::empty({tokens}, DType::i32);
  int32_t* o = off.data<int32_t>();
  int32_t* s = src.data<int32_t>();
  o[0] = 0;
  for (int64_t e = 0; e < E; ++e) o[e + 1] = o[e] + static_cast<int32_t>(rows[static_cast<size_t>(e)]);
  // Token t went to expert (first + t) mod E: list each expert's tokens in order.
  std::vector<int32_t> fill(o, o + E);
  for (int64_t t = 0; t < tokens; ++t)
    s[fill[static_cast<size_t>((first + t) % E)]++] = static_cast<int32_t>(t);
  if (device == Device::cpu) return {off, src};
  return {off.to(device), src.to(device)};
}

}  // namespace

std::vector<sizing::ExpertsPoint> run_experts_bench(const ExpertsBenchOptions& o, std::ostream& out) {
  o.validate();
  const int64_t E = o.experts, H = o.hidden, I = o.intermediate, L = experts_bench_layers(o);
  const int64_t max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
  const bool b16 = o.dtype == DType::bf16;
  // Weights ~ U(±1/√fan-in), as an init would draw them: the values only have to be ordinary.
  std::vector<ops::ExpertWeights> layers;
  for (int64_t l = 0; l < L; ++l)
    layers.push_back({uniform_on({E, 2 * I, H}, o.dtype, o.device, 2 * static_cast<uint64_t>(l) + 1,
                                 1.f / std::sqrt(static_cast<float>(H))),
                      uniform_on({E, H, I}, o.dtype, o.device, 2 * static_cast<uint64_t>(l) + 2,
                                 1.f / std::sqrt(static_cast<float>(I)))});
  const Tensor x = uniform_on({max_tokens, H}, DType::f32, o.device, 0, 1.f);
  auto f32 = [&](Shape s) { return Tensor::zeros(s, DType::f32, o.device); };
  auto bf = [&](Shape s) { return b16 ? Tensor::zeros(s, DType::bf16, o.device) : Tensor{}; };
  const ops::ExpertActs acts{f32({max_tokens, H}), f32({max_tokens, 2 * I}), f32({max_tokens, I}),
                             f32({max_tokens, H}), bf({max_tokens, H}),      bf({max_tokens, I})};
  const std::string dtype_name = b16 ? "bf16" : "f32";
  std::vector<sizing::ExpertsPoint> rows;
  for (int64_t T : o.tokens) {
    const int64_t hit = std::min(T, E);
    // Pass p routes to experts starting at (p · hit) mod E, so the passes walk every expert of every
    // layer before a weight is read again.
    std::vector<Routing> routings(static_cast<size_t>(E));
    auto routing = [&](int64_t pass) -> const Routing& {
      const int64_t first = (pass * hit) % E;
      Routing& r = routings[static_cast<size_t>(first)];
      if (!r.offsets.defined()) r = make_routing(T, E, first, o.device);
      return r;
    };
    const Tensor xt = x.slice(0, T);
    auto run_pass = [&](int64_t pass) {
      const Routing& r = routing(pass);
      for (int64_t l = 0; l < L; ++l)
        ops::experts_forward(acts, xt, r.src, r.offsets, layers[static_cast<size_t>(l)], T);
      if (o.device == Device::cuda) cuda::synchronize();
    };
    int64_t pass = 0;
    for (int i = 0; i < o.warmup; ++i) run_pass(pass++);
    std::vector<double> per_call;
    for (int i = 0; i < o.repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run_pass(pass++);
      per_call.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                         static_cast<double>(L));
    }
    rows.push_back({T, E, hit, H, I, dtype_name, median(per_call)});
  }
  char line[200];
  std::snprintf(
      line, sizeof line,
      "# experts op (ops::experts_forward): %lld experts of H %lld, I %lld, %s weights, %s; %lld layers "
      "(%.0f MiB) cycled so no call finds its weights in cache\n",
      static_cast<long long>(E), static_cast<long long>(H), static_cast<long long>(I), dtype_name.c_str(),
      o.device == Device::cuda ? "cuda" : "cpu", static_cast<long long>(L),
      static_cast<double>(L) * static_cast<double>(E) * 3.0 * static_cast<double>(H) *
          static_cast<double>(I) * static_cast<double>(dtype_size(o.dtype)) / (1 << 20));
  out << line << format_experts_table(rows);
  return rows;
}

std::string format_experts_table(const std::vector<sizing::ExpertsPoint>& rows) {
  std::ostringstream o;
  char line[200];
  std::snprintf(line, sizeof line, "#%-7s %6s %9s %12s %14s %12s\n", "tokens", "hit", "rows/exp", "median us",
                "us/hit expert", "weight GB/s");
  o << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, " %-7lld %6lld %9.2f %12.1f %14.1f %12.2f\n",
                  static_cast<long long>(r.tokens), static_cast<long long>(r.experts_hit),
                  r.rows_per_expert(), 1e6 * r.seconds, 1e6 * r.seconds / static_cast<double>(r.experts_hit),
                  r.weight_bytes() / r.seconds / 1e9);
    o << line;
  }
  return o.str();
}

void merge_experts_table(sizing::HardwareProfile& p, const std::vector<sizing::ExpertsPoint>& rows) {
  for (const auto& r : rows) {
    auto same = [&](const sizing::ExpertsPoint& x) {
      return x.tokens == r.tokens && x.experts == r.experts && x.hidden == r.hidden &&
             x.intermediate == r.intermediate && x.weight_dtype == r.weight_dtype;
    };
    auto it = std::find_if(p.experts_table.begin(), p.experts_table.end(), same);
    if (it != p.experts_table.end())
      *it = r;
    else
      p.experts_table.push_back(r);
  }
}

}  // namespace zaya::bench
