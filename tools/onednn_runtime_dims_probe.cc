// One-thread oneDNN f32 matmul C[M,N] = op(A)·op(B) built two ways: for the fixed shape, and with
// the token dim a runtime dim as zaya's grouped expert GEMMs build it (M when TA = n: x·Wᵀ and dy·W;
// K when TA = t: dyᵀ·x). Prints the best of 30 calls of each and the kernel oneDNN picked (brgemm
// takes no runtime dims in oneDNN 2.6: those go to its jit GEMM). The probe behind docs/ops-gemm.md's
// note on runtime dims, to run again when the oneDNN version changes.
//   OMP_NUM_THREADS=1 build/cuda/tools/onednn_runtime_dims_probe M N K TA TB     (TA, TB: n or t)
//   e.g. OMP_NUM_THREADS=1 build/cuda/tools/onednn_runtime_dims_probe 256 1024 256 n t   (the demo's gate_up x·Wᵀ)
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using dnnl::memory;

int main(int argc, char** argv) {
  if (argc != 6 || (argv[4][0] != 'n' && argv[4][0] != 't') || (argv[5][0] != 'n' && argv[5][0] != 't') ||
      (argv[4][0] == 't' && argv[5][0] == 't')) {
    std::fprintf(stderr, "usage: %s M N K TA TB   (nn, nt or tn: the grouped GEMMs' forms)\n", argv[0]);
    return 2;
  }
  const int64_t M = std::atol(argv[1]), N = std::atol(argv[2]), K = std::atol(argv[3]);
  const bool ta = argv[4][0] == 't', tb = argv[5][0] == 't';
  const auto f32 = memory::data_type::f32;
  constexpr int64_t R = DNNL_RUNTIME_DIM_VAL;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  // op(A) is [M, K] stored [M, K] (n) or [K, M] (t); op(B) is [K, N] stored [K, N] (n) or [N, K] (t).
  auto a_desc = [&](int64_t m, int64_t k) { return ta ? memory::desc({m, k}, f32, {1, M}) : memory::desc({m, k}, f32, {K, 1}); };
  auto b_desc = [&](int64_t k) { return tb ? memory::desc({k, N}, f32, {1, K}) : memory::desc({k, N}, f32, {N, 1}); };
  const memory::desc a_md = a_desc(M, K), b_md = b_desc(K), c_md({M, N}, f32, {N, 1});
  std::vector<float> A(static_cast<size_t>(M * K), 0.5f), B(static_cast<size_t>(K * N), 0.25f), C(static_cast<size_t>(M * N));
  memory am(a_md, eng, A.data()), bm(b_md, eng, B.data()), cm(c_md, eng, C.data());
  for (bool runtime : {false, true}) {
    memory::desc pa = a_md, pb = b_md, pc = c_md;
    if (runtime && !ta) pa = a_desc(R, K), pc = memory::desc({R, N}, f32, {N, 1});
    if (runtime && ta) pa = a_desc(M, R), pb = b_desc(R);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(pa, pb, pc), eng);
    const dnnl::matmul prim(pd);
    double best = 1e30;
    for (int i = 0; i < 30; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      prim.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      st.wait();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%ldx%ldx%ld %c%c %s: %.1f GFLOP/s (%s)\n", static_cast<long>(M), static_cast<long>(N),
                static_cast<long>(K), argv[4][0], argv[5][0], runtime ? "runtime dim" : "fixed shape",
                2.0 * M * N * K / best / 1e9, pd.impl_info_str());
  }
}
