// cuBLASLt GEMM timing for `zaya bench gemm --backend cuda` (compiled in CUDA builds only: the
// CMake glob leaves *_cuda.cc out otherwise). C[M,N] = A[M,K] B[K,N], row-major, computed as the
// column-major C^T = B^T A^T, f32 accumulation, f32 output, timed with CUDA events.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "zaya/bench/gemm_bench.h"
#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/core/tensor.h"

namespace zaya::bench {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}
void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLASLt error in ") + what + ": status " + std::to_string(static_cast<int>(s)));
}

}  // namespace

double time_gemm_cuda(const GemmCase& c, DType dtype, int warmup, int repeats) {
  const bool bf16 = dtype == DType::bf16;
  const size_t in_bytes = bf16 ? 2 : 4;
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  void *A = nullptr, *B = nullptr, *C = nullptr, *work = nullptr;
  const size_t work_bytes = 32u << 20;
  check_cuda(cudaMalloc(&A, static_cast<size_t>(c.m * c.k) * in_bytes), "cudaMalloc A");
  check_cuda(cudaMalloc(&B, static_cast<size_t>(c.k * c.n) * in_bytes), "cudaMalloc B");
  check_cuda(cudaMalloc(&C, static_cast<size_t>(c.m * c.n) * 4), "cudaMalloc C");
  check_cuda(cudaMalloc(&work, work_bytes), "cudaMalloc workspace");
  // Random operands (never zeros), generated on the host in the operand dtype and copied over.
  {
    Tensor ha = Tensor::empty({c.m, c.k}, dtype), hb = Tensor::empty({c.k, c.n}, dtype);
    fill_uniform(ha, 1, 0, -1.f, 1.f);
    fill_uniform(hb, 2, 0, -1.f, 1.f);
    check_cuda(cudaMemcpy(A, ha.raw(), ha.nbytes(), cudaMemcpyHostToDevice), "copy A");
    check_cuda(cudaMemcpy(B, hb.raw(), hb.nbytes(), cudaMemcpyHostToDevice), "copy B");
  }
  cublasLtHandle_t lt;
  check_lt(cublasLtCreate(&lt), "create");
  cublasLtMatmulDesc_t op;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  // Column-major view: C^T [N, M] = B^T [N, K] · A^T [K, M]; the row-major buffers are exactly these.
  cublasLtMatrixLayout_t lb, la, lc;
  check_lt(cublasLtMatrixLayoutCreate(&lb, in_type, c.n, c.k, c.n), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&la, in_type, c.k, c.m, c.k), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, c.n, c.m, c.n), "layout C");
  cublasLtMatmulPreference_t pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &work_bytes, sizeof work_bytes),
           "workspace preference");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, lc, lc, pref, 1, &heur, &found), "heuristic");
  if (found == 0) throw Error("cuBLASLt has no algorithm for this GEMM", {.found = std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k)});
  const float alpha = 1.f, beta = 0.f;
  auto run = [&] {
    check_lt(cublasLtMatmul(lt, op, &alpha, B, lb, A, la, &beta, C, lc, C, lc, &heur.algo, work, work_bytes, nullptr), "matmul");
  };
  for (int i = 0; i < warmup; ++i) run();
  cudaEvent_t e0, e1;
  check_cuda(cudaEventCreate(&e0), "event");
  check_cuda(cudaEventCreate(&e1), "event");
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    check_cuda(cudaEventRecord(e0), "record");
    run();
    check_cuda(cudaEventRecord(e1), "record");
    check_cuda(cudaEventSynchronize(e1), "synchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  cudaFree(work);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace zaya::bench
