// In-process A/B of a temporary code switch: the code under test reads the environment variable
// ZAYA_AB on every call (`std::getenv("ZAYA_AB") != nullptr` picks variant B), and this driver
// alternates the two variants call by call inside one process (A B, then B A, ...), so both see the
// same minutes of a shared VM whose speed drifts by up to 2× within minutes. It prints the median of
// the paired time ratios A/B (> 1: B is faster) and how many pairs B won. On the 2-vCPU Intel VM it
// resolves what tools/step_ab.py, whose variants are separate processes seconds apart, cannot (±10–15%
// per round; docs/results/model-cpu-sessions.md, session 20), but not 1–1.5% in one run: with no switch
// in the code at all, `step` read 0.992–1.015 over nine runs of 40–60 pairs, 1.010 on average
// with B the variant that sets the variable (session 22, model-cpu/switch-ab-2026-11-27-s22.txt).
// Run an A/A beside a small effect. `step` also prints how many gradient elements the two
// variants disagree on after one more step of each, so a switch that changes the numbers shows.
//
//   step [PAIRS]       whole training steps of configs/demo.toml (zero_grad, forward with the loss,
//                      backward), batch 8 × 256, random tokens (default 16 pairs)
//   attention [PAIRS]  cpu::attention_fwd and attention_bwd at the demo's per-layer shape, 5 calls
//                      of each per variant per pair (default 30 pairs), ratios for each
//   head [PAIRS]       cpu::tied_head_forward and tied_head_backward_gemms at the demo's shape
//                      (2048 tokens, H 256, V 8192), one call of each per variant per pair
//
// Read the variable once per call of the function under test, into a local or a `volatile` global,
// not per inner iteration (getenv costs ~0.1 µs: tens of thousands of calls bias the timing), and
// check with objdump that variant B's code is there: GCC removed a plain internal-linkage bool that
// was set before an OpenMP region and read only inside it, and with it every prefetch it guarded
// (session 20's first try of the head's prefetch measured 1.000 for that reason).
//
// Build (one line; from the repository root, after cmake --build build/cuda):
//   g++ -std=c++20 -O3 -march=native -fopenmp -Isrc tools/switch_ab.cc build/cuda/libzaya_model.a
//       build/cuda/libzaya_ops.a build/cuda/libzaya_core.a -L/usr/local/cuda/lib
//       -Wl,-rpath,/usr/local/cuda/lib -lcudart -lcublasLt -lcublas -ltomlplusplus -ldnnl -lopenblas -o
//       /tmp/switch_ab
//   OMP_NUM_THREADS=2 /tmp/switch_ab step 16
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "zaya/core/config.h"
#include "zaya/core/philox.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/attention_cpu.h"
#include "zaya/ops/cpu/tied_head_cpu.h"

using namespace zaya;
using clock_type = std::chrono::steady_clock;

namespace {

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

void set_variant(bool b) {
  if (b)
    setenv("ZAYA_AB", "1", 1);
  else
    unsetenv("ZAYA_AB");
}

// Runs `pairs` pairs of the parts (each returns its seconds for one variant), alternating the order
// per pair, and prints each part's paired median ratio A/B.
void run_pairs(int pairs, const std::vector<std::string>& names,
               const std::function<std::vector<double>(bool)>& once) {
  once(false), once(true);  // untimed: first-call costs of either variant
  const size_t parts = names.size();
  std::vector<std::vector<double>> ratio(parts), ta(parts), tb(parts);
  std::vector<int> wins(parts, 0);
  for (int p = 0; p < pairs; ++p) {
    std::vector<double> a, b;
    if (p % 2) {
      b = once(true), a = once(false);
    } else {
      a = once(false), b = once(true);
    }
    for (size_t i = 0; i < parts; ++i) {
      ratio[i].push_back(a[i] / b[i]);
      ta[i].push_back(a[i]);
      tb[i].push_back(b[i]);
      wins[i] += a[i] > b[i];
    }
  }
  for (size_t i = 0; i < parts; ++i)
    std::printf("%-10s A %8.2f ms  B %8.2f ms (medians)  A/B paired median %.3f  B faster in %d of %d\n",
                names[i].c_str(), 1e3 * median(ta[i]), 1e3 * median(tb[i]), median(ratio[i]), wins[i], pairs);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void fill(std::vector<float>& x, unsigned seed) {
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(((i + seed) * 2654435761u) % 1000) / 1000.0f - 0.5f;
}

void ab_step(int pairs) {
  const int64_t B = 8, T = 256;
  ConfigReader reader = ConfigReader::from_file("configs/demo.toml");
  model::ZayaModel m(model::ModelConfig::from_toml(reader), B, T);
  m.init(1);
  // The tokens of `zaya bench step` (apps/cmd_bench_step.cc), so the steps are the same.
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), tg(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = 1 + static_cast<int32_t>(philox_uniform(12345, i) * static_cast<float>(V - 1)) %
                     static_cast<int32_t>(V - 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) tg[b * T + t] = t + 1 < T ? ids[b * T + t + 1] : -100;
  Tensor tid = Tensor::borrow(ids.data(), Shape{B, T}, DType::i32);
  Tensor ttg = Tensor::borrow(tg.data(), Shape{B, T}, DType::i32);
  run_pairs(pairs, {"step"}, [&](bool b) {
    set_variant(b);
    m.zero_grad();
    const auto t0 = clock_type::now();
    m.forward(tid, ttg, true);
    m.backward();
    return std::vector<double>{seconds_since(t0)};
  });
  // Whether the switch changed the numbers: one more step per variant, losses and gradients compared.
  std::vector<float> grads[2];
  double loss[2];
  for (int b = 0; b < 2; ++b) {
    set_variant(b == 1);
    m.zero_grad();
    loss[b] = m.forward(tid, ttg, true);
    m.backward();
    grads[b].assign(m.grads_flat().data<float>(), m.grads_flat().data<float>() + m.grads_flat().numel());
  }
  size_t differ = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) differ += std::memcmp(&grads[0][i], &grads[1][i], 4) != 0;
  std::printf("step bits: loss A %.9g B %.9g, %zu of %zu gradient elements differ\n", loss[0], loss[1], differ,
              grads[0].size());
}

void ab_attention(int pairs) {
  const int64_t B = 8, T = 256, nq = 4, nkv = 2, hd = 64;
  std::vector<float> q(B * T * nq * hd), k(B * T * nkv * hd), v(k.size()), o(q.size()), lse(B * nq * T),
      dout(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  fill(q, 1), fill(k, 2), fill(v, 3), fill(dout, 4);
  run_pairs(pairs, {"forward", "backward"}, [&](bool b) {
    set_variant(b);
    double f = 0, g = 0;
    for (int it = 0; it < 5; ++it) {
      auto t0 = clock_type::now();
      ops::cpu::attention_fwd(o.data(), lse.data(), q.data(), k.data(), v.data(), B, T, nq, nkv, hd);
      f += seconds_since(t0);
      t0 = clock_type::now();
      ops::cpu::attention_bwd(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                              o.data(), lse.data(), B, T, nq, nkv, hd);
      g += seconds_since(t0);
    }
    return std::vector<double>{f, g};
  });
}

void ab_head(int pairs) {
  if (!ops::cpu::tied_head_fused_built()) {
    std::printf("this build has no AVX-512: no fused head\n");
    return;
  }
  const int64_t n = 2048, hd = 256, V = 8192;
  std::vector<float> e(static_cast<size_t>(ops::cpu::tied_head_strip_elems(n, V)) + 16), h(n * hd), E(V * hd),
      mx(n), sum(n), picked(n), r(n, 1.0f / n), dE(V * hd), dh(n * hd);
  float* e64 = e.data() + (16 - reinterpret_cast<uintptr_t>(e.data()) / 4 % 16) % 16;  // 64-byte aligned
  std::vector<int32_t> tg(n);
  fill(h, 1), fill(E, 2);
  for (int64_t i = 0; i < n; ++i) tg[i] = static_cast<int32_t>((i * 7919) % V);
  run_pairs(pairs, {"forward", "backward"}, [&](bool b) {
    set_variant(b);
    auto t0 = clock_type::now();
    ops::cpu::tied_head_forward(e64, mx.data(), sum.data(), picked.data(), h.data(), E.data(), tg.data(), n,
                                hd, V, 0x1p-100f);
    const double f = seconds_since(t0);
    t0 = clock_type::now();
    ops::cpu::tied_head_backward_gemms(dE.data(), dh.data(), e64, h.data(), r.data(), E.data(), n, hd, V,
                                       0x1p-100f);
    return std::vector<double>{f, seconds_since(t0)};
  });
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const int pairs = argc > 2 ? std::atoi(argv[2]) : 0;
  if (what == "step") {
    ab_step(pairs > 0 ? pairs : 16);
  } else if (what == "attention") {
    ab_attention(pairs > 0 ? pairs : 30);
  } else if (what == "head") {
    ab_head(pairs > 0 ? pairs : 30);
  } else {
    std::fprintf(stderr, "usage: switch_ab step|attention|head [PAIRS]  (see the file's header)\n");
    return 2;
  }
  return 0;
}
