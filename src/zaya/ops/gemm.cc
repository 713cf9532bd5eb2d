// The GEMM fronts: argument checks for any device, then the kernel for the tensors' device (CPU:
// cpu/gemm_cpu.cc and cpu/gemm_grouped_cpu.cc; CUDA: cuda/gemm.cu through cuBLASLt).
#include "zaya/ops/gemm.h"

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm_checks.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/gemm_cuda.h"
#endif

namespace zaya::ops {
namespace {

// Whether x and y share bytes (their addresses only: nothing is read).
bool overlaps(const Tensor& x, const Tensor& y) {
  auto* x0 = static_cast<const char*>(x.raw());
  auto* y0 = static_cast<const char*>(y.raw());
  return x.nbytes() > 0 && y.nbytes() > 0 && x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

}  // namespace

GemmDims check_gemm_problem(std::string_view op, const Tensor& A, Trans ta, const Tensor& B, Trans tb,
                            const Tensor& C) {
  check::defined(op, "A", A);
  check::defined(op, "B", B);
  check::defined(op, "C", C);
  ZAYA_CHECK(A.dtype() == B.dtype() && (A.dtype() == DType::f32 || A.dtype() == DType::bf16), op,
             ": A and B must both be f32 or both bf16, found ", A.str(), " and ", B.str());
  ZAYA_CHECK(C.dtype() == DType::f32, op, ": C must be f32, found ", C.str());
  ZAYA_CHECK(A.ndim() == 2 || A.ndim() == 3, op, ": A must be 2-D or batched 3-D, found ", A.str());
  ZAYA_CHECK(C.ndim() == A.ndim(), op, ": C ", C.str(), " must have as many dims as A ", A.str());
  ZAYA_CHECK(B.ndim() == 2 || B.ndim() == A.ndim(), op, ": B ", B.str(), " must be 2-D or match A ", A.str());
  const GemmDims d = gemm_dims(A, ta, B, tb);
  ZAYA_CHECK(d.batch_b == d.batch || B.ndim() == 2, op, ": batch of B ", B.str(), " differs from A ",
             A.str());
  int64_t kb, nb;
  gemm_op_dims(B, tb, kb, nb);
  ZAYA_CHECK(d.k == kb, op, ": inner dims differ: op(A) is [", d.m, ", ", d.k, "] from A ", A.str(),
             ", op(B) is [", kb, ", ", d.n, "] from B ", B.str());
  check::shape(op, "C", C, A.ndim() == 3 ? Shape{d.batch, d.m, d.n} : Shape{d.m, d.n});
  ZAYA_CHECK(!overlaps(C, A) && !overlaps(C, B), op, ": C must not overlap A or B");
  return d;
}

void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha, float beta) {
  constexpr std::string_view op = "gemm";
  const OpDevice on(op, {{"A", A}, {"B", B}, {"C", C}});
  const GemmDims d = check_gemm_problem(op, A, ta, B, tb, C);
  if (on.cpu()) return cpu::gemm(d, A, ta, B, tb, C, alpha, beta);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::gemm(d, A, ta, B, tb, C, alpha, beta);
#endif
  on.no_kernel();
}

void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  constexpr std::string_view op = "gemm_grouped";
  OpDevice on(op);
  for (size_t i = 0; i < problems.size(); ++i) {
    const GemmProblem& p = problems[i];
    on.add("problems", i, ".A", p.A);
    on.add("problems", i, ".B", p.B);
    on.add("problems", i, ".C", p.C);
    check_gemm_problem(op, p.A, ta, p.B, tb, p.C);
  }
  if (on.cpu()) return cpu::gemm_grouped(problems, ta, tb, alpha, beta);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::gemm_grouped(problems, ta, tb, alpha, beta);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
