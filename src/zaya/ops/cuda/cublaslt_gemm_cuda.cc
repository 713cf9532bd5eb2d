// cuBLASLt matmuls with a per-thread plan cache (cublaslt_gemm.h).
//
// The operands are handed over as lt_mapping says (cuBLASLt's A is our B, its B our A). The bias
// epilogue adds a vector along the rows of column-major D, which are C's columns: one value per
// output feature, as linear's bias is.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <unordered_map>

#include "zaya/core/cuda_context.h"
#include "zaya/core/error.h"
#include "zaya/ops/cuda/cublaslt_gemm.h"

namespace zaya::ops::cuda {
namespace {

void check_lt(cublasStatus_t s, std::string_view op, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(str("ops::", op, ": cuBLASLt ", what, " failed: ", cublasLtGetStatusString(s)));
}

// The largest power of two up to 256 that divides the address (and, for a batch, every matrix's
// address): cuBLASLt's heuristic assumes 256-byte alignment unless told less, and an algorithm
// chosen for more alignment than a pointer has may not run on it.
uint32_t alignment(const void* p, int64_t stride_bytes, int64_t batch) {
  uint64_t a = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) a |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(a & (~a + 1));  // lowest set bit
}

struct PlanKey {
  int64_t m, n, k, batch, stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  uint8_t ta, tb, in, bias;
  bool operator==(const PlanKey& o) const { return std::memcmp(this, &o, sizeof(PlanKey)) == 0; }
};
static_assert(sizeof(PlanKey) == 7 * 8 + 3 * 4 + 4, "PlanKey must have no padding: it is compared bytewise");

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    // FNV-1a over the key's bytes (no padding, checked above).
    const auto* b = reinterpret_cast<const unsigned char*>(&k);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(PlanKey); ++i) h = (h ^ b[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// A matmul descriptor, the layouts of cuBLASLt's A (our B), B (our A) and C = D, and the chosen
// algorithm. Descriptors are host objects, independent of the handle.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lay_a = nullptr, lay_b = nullptr, lay_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = true;  // false: no algorithm with the bias epilogue (the caller adds the bias)
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lay_c) cublasLtMatrixLayoutDestroy(lay_c);
    if (lay_b) cublasLtMatrixLayoutDestroy(lay_b);
    if (lay_a) cublasLtMatrixLayoutDestroy(lay_a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

using PlanCache = std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash>;
PlanCache& plans() {
  thread_local PlanCache cache;  // one per thread, as the device context is
  return cache;
}

cublasLtMatrixLayout_t make_layout(std::string_view op, cudaDataType_t type, const LtLayout& lay, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(lay.rows), static_cast<uint64_t>(lay.cols), lay.ld),
           op, "layout");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), op,
             "batch count");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
             op, "batch stride");
  }
  return l;
}

std::unique_ptr<Plan> make_plan(std::string_view op, const PlanKey& key, cublasLtHandle_t handle) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t in = key.in == static_cast<uint8_t>(DType::bf16) ? CUDA_R_16BF : CUDA_R_32F;
  check_lt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "matmul descriptor");
  const LtMapping map = lt_mapping(key.m, key.n, key.k, key.ta ? Trans::T : Trans::N, key.tb ? Trans::T : Trans::N);
  const cublasOperation_t lt_a = map.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t lt_b = map.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &lt_a, sizeof lt_a), op,
           "transpose");
  check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &lt_b, sizeof lt_b), op,
           "transpose");
  if (key.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), op,
             "bias epilogue");
  }
  plan->lay_a = make_layout(op, in, map.a, key.batch, key.stride_b);
  plan->lay_b = make_layout(op, in, map.b, key.batch, key.stride_a);
  plan->lay_c = make_layout(op, CUDA_R_32F, map.c, key.batch, key.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), op, "preference");
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = zaya::cuda::DeviceContext::kCublasLtWorkspaceBytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), op,
           "workspace preference");
  const uint32_t al_a = key.align_b, al_b = key.align_a, al_c = key.align_c;  // cuBLASLt's A is our B
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
           op, "alignment preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
           op, "alignment preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
           op, "alignment preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c),
           op, "alignment preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->lay_a, plan->lay_b, plan->lay_c,
                                                           plan->lay_c, pref, 1, &result, &found);
  // NOT_SUPPORTED: no heuristic for this configuration, i.e. no algorithm (as found = 0 says).
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && result.state != CUBLAS_STATUS_SUCCESS))
    found = 0;
  else
    check_lt(st, op, "heuristic");
  if (found == 0 && key.bias) {
    plan->supported = false;
    return plan;
  }
  if (found == 0)
    throw Error(str("ops::", op, ": cuBLASLt has no algorithm for C [", key.m, ", ", key.n, "] = op(A)·op(B) with k = ",
                    key.k, ", batch ", key.batch, ", ", key.in == static_cast<uint8_t>(DType::bf16) ? "bf16" : "f32",
                    " inputs, alignments ", key.align_a, "/", key.align_b, "/", key.align_c, " bytes"));
  plan->algo = result.algo;
  return plan;
}

}  // namespace

bool lt_matmul(std::string_view op, const LtProblem& p, float alpha, float beta) {
  zaya::cuda::DeviceContext* context = nullptr;
  try {
    context = &zaya::cuda::current();
  } catch (const Error& e) {
    throw Error(str("ops::", op, ": ", e.what()));
  }
  zaya::cuda::DeviceContext& ctx = *context;
  const int64_t esize = p.in == DType::bf16 ? 2 : 4;
  const PlanKey key{p.m,
                    p.n,
                    p.k,
                    p.batch,
                    p.batch > 1 ? p.stride_a : 0,
                    p.batch > 1 ? p.stride_b : 0,
                    p.batch > 1 ? p.stride_c : 0,
                    alignment(p.A, p.stride_a * esize, p.batch),
                    alignment(p.B, p.stride_b * esize, p.batch),
                    alignment(p.C, p.stride_c * 4, p.batch),
                    static_cast<uint8_t>(p.ta == Trans::T),
                    static_cast<uint8_t>(p.tb == Trans::T),
                    static_cast<uint8_t>(p.in),
                    static_cast<uint8_t>(p.bias != nullptr)};
  auto handle = static_cast<cublasLtHandle_t>(ctx.cublaslt());
  PlanCache& cache = plans();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(op, key, handle)).first;
  Plan& plan = *it->second;
  if (!plan.supported) return false;
  if (p.bias)  // the pointer changes from call to call; the epilogue is part of the key
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias), op,
             "bias pointer");
  check_lt(cublasLtMatmul(handle, plan.desc, &alpha, p.B, plan.lay_a, p.A, plan.lay_b, &beta, p.C, plan.lay_c, p.C,
                          plan.lay_c, &plan.algo, ctx.cublaslt_workspace(),
                          zaya::cuda::DeviceContext::kCublasLtWorkspaceBytes, static_cast<cudaStream_t>(ctx.stream())),
           op, "matmul");
  return true;
}

int64_t lt_plan_count() { return static_cast<int64_t>(plans().size()); }

}  // namespace zaya::ops::cuda
