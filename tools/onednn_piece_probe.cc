// One-thread oneDNN f32 matmul rate for C[M,N] = op(A)·op(B) run as P row pieces of M/P rows, with
// the operands' row strides padded by PAD_A / PAD_B floats: the probe behind the GEMM piece rules in
// src/zaya/ops/gemm.cc (no-copy threshold, padded copies), to run again when oneDNN or the CPU
// changes. Operands are 64-byte aligned, like zaya's tensors. Prints the best of 5 passes and
// oneDNN's kernel name. Two environment switches make it the expert GEMMs' case
// (src/zaya/ops/gemm_grouped.cc): RUNTIME_M=1 builds the primitive with M as a runtime dim (one
// primitive for every token count), EXPERTS=E gives the pieces E distinct B operands in turn
// (expert weights, not one hot copy).
//   OMP_NUM_THREADS=1 build/cuda/tools/onednn_piece_probe M N K TA TB PAD_A PAD_B P    (TA, TB: n or t)
//   e.g. OMP_NUM_THREADS=1 build/cuda/tools/onednn_piece_probe 8192 256 2048 t n 0 0 1   (the demo LM head's dW)
//   RUNTIME_M=1 EXPERTS=8 OMP_NUM_THREADS=1 build/cuda/tools/onednn_piece_probe 2048 1024 256 n t 0 0 8
//       (the demo's expert gate_up: 8 experts of 256 tokens)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

using dnnl::memory;

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s M N K TA TB PAD_A PAD_B P\n", argv[0]);
    return 2;
  }
  const int64_t M = std::atol(argv[1]), N = std::atol(argv[2]), K = std::atol(argv[3]);
  const char ta = argv[4][0], tb = argv[5][0];
  const int64_t pad_a = std::atol(argv[6]), pad_b = std::atol(argv[7]);
  const int P = std::atoi(argv[8]);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  // Stored shapes: A is [M, K] (n) or [K, M] (t); B is [K, N] (n) or [N, K] (t).
  const int64_t a_rows = ta == 'n' ? M : K, lda = (ta == 'n' ? K : M) + pad_a;
  const int64_t b_rows = tb == 'n' ? K : N, ldb = (tb == 'n' ? N : K) + pad_b;
  auto random_buffer = [](int64_t n) {
    auto* p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((n + 16) * 4 + 63) / 64 * 64));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(std::rand()) / RAND_MAX * 2 - 1;
    return p;
  };
  const int experts = std::getenv("EXPERTS") ? std::max(1, std::atoi(std::getenv("EXPERTS"))) : 1;
  const bool runtime_m = std::getenv("RUNTIME_M") != nullptr && std::string(std::getenv("RUNTIME_M")) == "1";
  float *A = random_buffer(a_rows * lda), *B = random_buffer(b_rows * ldb * experts),
        *C = random_buffer(M * N);
  const int64_t pm = M / P;
  auto desc = [](int64_t r, int64_t c, char t, int64_t ld) {
    return t == 'n' ? memory::desc({r, c}, memory::data_type::f32, {ld, 1})
                    : memory::desc({r, c}, memory::data_type::f32, {1, ld});
  };
  memory::desc a = desc(pm, K, ta, lda), b = desc(K, N, tb, ldb), c({pm, N}, memory::data_type::f32, {N, 1});
  // The primitive's view: M given only at execution with RUNTIME_M=1 (the memory keeps pm rows).
  const memory::dim pm_built = runtime_m ? DNNL_RUNTIME_DIM_VAL : pm;
  memory::desc a_built = desc(pm_built, K, ta, lda), c_built({pm_built, N}, memory::data_type::f32, {N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_built, b, c_built), attr, eng);
  dnnl::matmul mm(pd);
  std::vector<uint8_t> scratch(pd.scratchpad_desc().get_size() + 64);
  memory sm(pd.scratchpad_desc(), eng, scratch.data());
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < P; ++i) {
      memory am(a, eng, A + (ta == 'n' ? i * pm * lda : i * pm)),
          bm(b, eng, B + (i % experts) * b_rows * ldb), cm(c, eng, C + i * pm * N);
      mm.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
    }
    st.wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * M * N * K / s / 1e9);
  }
  std::printf("%ldx%ldx%ld %c%c pad %ld/%ld pieces %d: %.1f GFLOP/s (%s)\n", static_cast<long>(M),
              static_cast<long>(N), static_cast<long>(K), ta, tb, static_cast<long>(pad_a), static_cast<long>(pad_b), P,
              best, pd.impl_info_str());
  std::free(A);
  std::free(B);
  std::free(C);
}
