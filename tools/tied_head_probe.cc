// The fused tied head's two kernels at the demo's shape (2048 tokens, H 256, V 8192), timed apart:
// tied_head_forward (logits = h·Eᵀ with the softmax) and tied_head_backward_gemms (dE += eᵀ·(r ⊙ h)
// and dh = e·E), best and median of 8 calls each, with the GFLOP/s of the best. The harness behind the
// per-kernel figures in docs/ops-gemm.md ("The tied LM head and its loss, fused"); the end-to-end
// A/B against the row-major path is bench_ops_dense's BM_cross_entropy_tied.
//   OMP_NUM_THREADS=2 build/cuda/tools/tied_head_probe
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "zaya/ops/cpu/tied_head_cpu.h"

using namespace zaya::ops::cpu;

int main() {
  if (!tied_head_fused_built()) {
    std::printf("this build has no AVX-512: no fused head\n");
    return 0;
  }
  const int64_t n = 2048, hd = 256, V = 8192;
  auto* e = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(tied_head_strip_elems(n, V)) * 4));
  std::vector<float> h(n * hd), E(V * hd), mx(n), sum(n), picked(n), r(n, 1.0f / n), dE(V * hd), dh(n * hd);
  std::vector<int32_t> tg(n);
  for (int64_t i = 0; i < n * hd; ++i) h[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (int64_t i = 0; i < V * hd; ++i) E[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
  for (int64_t i = 0; i < n; ++i) tg[i] = static_cast<int32_t>((i * 7919) % V);
  using clock = std::chrono::steady_clock;
  constexpr int kReps = 8;
  std::vector<double> fwd, bwd;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto t0 = clock::now();
    tied_head_forward(e, mx.data(), sum.data(), picked.data(), h.data(), E.data(), tg.data(), n, hd, V, 0x1p-100f);
    const auto t1 = clock::now();
    tied_head_backward_gemms(dE.data(), dh.data(), e, h.data(), r.data(), E.data(), n, hd, V, 0x1p-100f);
    const auto t2 = clock::now();
    fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    bwd.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  // Best and median: on a shared VM the best call shows the kernel, the median what a step sees
  // (load imbalance between the threads included).
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  const double product = 2.0 * n * hd * V * 1e-9;
  std::printf("forward (logits + softmax)  best %6.2f ms  %6.1f GFLOP/s   median %6.2f ms\n", fwd[0] * 1e3,
              product / fwd[0], fwd[kReps / 2] * 1e3);
  std::printf("backward (dE and dh)        best %6.2f ms  %6.1f GFLOP/s   median %6.2f ms\n", bwd[0] * 1e3,
              2 * product / bwd[0], bwd[kReps / 2] * 1e3);
  std::free(e);
}
