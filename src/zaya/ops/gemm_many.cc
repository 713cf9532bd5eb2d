// Argument checks and dispatch for independent GEMMs (kernels in cpu/gemm_many_cpu.cc and
// cuda/gemm.cu; each problem is checked again by ops::gemm).
#include "zaya/ops/gemm_many.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/gemm_many_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/gemm_cuda.h"
#endif

namespace zaya::ops {

void gemm_many(std::span<const GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  constexpr std::string_view op = "gemm_many";
  OpDevice on(op);
  for (size_t i = 0; i < problems.size(); ++i) {
    on.add("problems", i, ".A", problems[i].A);
    on.add("problems", i, ".B", problems[i].B);
    on.add("problems", i, ".C", problems[i].C);
    for (size_t j = 0; j < i; ++j)
      ZAYA_CHECK(problems[i].C.raw() != problems[j].C.raw(), op, ": problems ", j, " and ", i,
                 " write the same output ", problems[i].C.str());
  }
  if (on.cpu()) return cpu::gemm_many(problems, ta, tb, alpha, beta);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::gemm_many(problems, ta, tb, alpha, beta);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
