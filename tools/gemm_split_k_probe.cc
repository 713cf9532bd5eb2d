// Which weight-gradient products (dW = dyᵀ·x: Aᵀ·B, the tokens being the reduction dim K) oneDNN
// sums differently on 1 and on more threads: straight oneDNN matmul primitives, built and run with
// omp_set_num_threads(t), results compared bit for bit with t = 1 (NN=1 in the environment: A·B
// instead). The evidence behind reduction_may_split (src/zaya/ops/gemm.cc): with few output blocks
// to share out, brgemm splits K among the threads, so the partial sums depend on the thread count.
// Run it again after changing the oneDNN version or on a new CPU family: the rule follows oneDNN's
// blocking, which both change.
//
//   build/cuda/tools/gemm_split_k_probe [K]      (K: tokens, default 2048; NN=1 for A·B)
//
// On a 2-core Intel Xeon (oneDNN 2.6.3, brg:avx512_core), K = 2048: every M × N with N ≤ 64
// (M 9–1024) differed on 2 threads, the demo router's 64×64 and 9×64 among them; N ≥ 65 did not,
// nor did 3, 4 or 8 threads. At K = 8192 every shape tried differed on 8 threads (up to 1024 ×
// 256), most on 4, and N ≤ 64 on 2. The plain form A·B never differed (K 2048).
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

namespace {

std::vector<float> run(int threads, int64_t M, int64_t N, int64_t K, const std::vector<float>& a,
                       const std::vector<float>& b) {
  using dnnl::memory;
  omp_set_num_threads(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  // C[M, N] = Aᵀ·B with A stored [K, M] (strides {1, M}; for A·B [M, K]) and B [K, N]; C starts
  // at 0.25, beta 1.
  memory::desc ad({M, K}, memory::data_type::f32,
                  std::getenv("NN") ? memory::dims{K, 1} : memory::dims{1, M}),
      bd({K, N}, memory::data_type::f32, {N, 1}), cd({M, N}, memory::data_type::f32, {N, 1});
  dnnl::post_ops po;
  po.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, eng);
  std::vector<float> c(static_cast<size_t>(M * N), 0.25f);
  memory am(ad, eng, const_cast<float*>(a.data())), bm(bd, eng, const_cast<float*>(b.data())),
      cm(cd, eng, c.data());
  dnnl::matmul(pd).execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  s.wait();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t K = argc > 1 ? std::atol(argv[1]) : 2048;
  const int threads[] = {2, 3, 4, 8};
  std::printf("%s, K = %lld: bits against 1 thread\n%9s", std::getenv("NN") ? "A·B" : "Aᵀ·B",
              static_cast<long long>(K), "M x N");
  for (int t : threads) std::printf("  %2d thr", t);
  std::printf("\n");
  for (int64_t M : {9, 64, 256, 1024})
    for (int64_t N : {9, 16, 64, 65, 127, 128, 256}) {
      std::vector<float> a(static_cast<size_t>(K * M)), b(static_cast<size_t>(K * N));
      for (size_t i = 0; i < a.size(); ++i)
        a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.3f;
      const std::vector<float> one = run(1, M, N, K, a, b);
      std::printf("%4lld x %-4lld", static_cast<long long>(M), static_cast<long long>(N));
      for (int t : threads) {
        const std::vector<float> c = run(t, M, N, K, a, b);
        std::printf("  %6s",
                    std::memcmp(one.data(), c.data(), one.size() * sizeof(float)) ? "DIFFER" : "same");
      }
      std::printf("\n");
    }
}
