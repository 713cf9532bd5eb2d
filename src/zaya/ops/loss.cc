// The cross-entropy fronts: argument checks for any device, then the kernel for the tensors'
// device (CPU: cpu/loss_cpu.cc; CUDA: cuda/loss.cu).
#include "zaya/ops/loss.h"

#include <algorithm>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/loss_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/loss_cuda.h"
#endif

namespace zaya::ops {
namespace {

// h and E are both `gemm_dtype`: f32, or bf16 for the bf16 GEMM path (where the ops call them h16
// and E16, as the messages do).
void check_tied_args(std::string_view op, const Tensor& h, const Tensor& E, const Tensor& targets,
                     const Tensor& lse, const Tensor& workspace, const CrossEntropyOptions& opt,
                     DType gemm_dtype = DType::f32) {
  const bool bf16_inputs = gemm_dtype == DType::bf16;
  const std::string_view h_name = bf16_inputs ? "h16" : "h", E_name = bf16_inputs ? "E16" : "E";
  check::dtype(op, h_name, h, gemm_dtype);
  check::dtype(op, E_name, E, gemm_dtype);
  ZAYA_CHECK(h.ndim() == 2, op, ": ", h_name, " must be [N, H], found ", h.str());
  ZAYA_CHECK(E.ndim() == 2 && E.size(1) == h.size(1), op, ": ", E_name, " must be [V, ", h.size(1), "] to match ",
             h_name, " ", h.shape().str(), ", found ", E.shape().str());
  const int64_t n = h.size(0), vocab = E.size(0);
  ZAYA_CHECK(vocab > 0, op, ": empty vocabulary, ", E_name, " is ", E.shape().str());
  ZAYA_CHECK(opt.chunk > 0, op, ": chunk must be positive, found ", opt.chunk);
  check::i32(op, "targets", targets);
  check::shape(op, "targets", targets, Shape{n});
  check::f32(op, "lse", lse);
  check::shape(op, "lse", lse, Shape{n});
  check::f32(op, "workspace", workspace);
  const int64_t need = cross_entropy_workspace_elems(n, vocab, opt);
  ZAYA_CHECK(workspace.numel() >= need, op, ": workspace has ", workspace.numel(), " elements, needs ", need,
             " (N = ", n, ", chunk = ", std::min(opt.chunk, vocab), ")");
}

// logits [N, V] f32, lse [N] f32, N i32 targets; returns N.
int64_t check_logits_args(std::string_view op, const Tensor& logits, const Tensor& lse,
                          const Tensor& targets) {
  check::f32(op, "logits", logits);
  ZAYA_CHECK(logits.ndim() == 2, op, ": logits must be [N, V], found ", logits.str());
  const int64_t N = logits.size(0);
  check::f32(op, "lse", lse);
  check::shape(op, "lse", lse, Shape{N});
  check::i32(op, "targets", targets);
  ZAYA_CHECK(targets.numel() == N, op, ": ", targets.str(), " targets for ", N, " rows");
  return N;
}

}  // namespace

int64_t cross_entropy_workspace_elems(int64_t n, int64_t vocab, const CrossEntropyOptions& opt) {
  return cpu::cross_entropy_workspace_elems(n, vocab, opt);
}

CrossEntropyResult cross_entropy_tied_forward(const Tensor& lse, const Tensor& h, const Tensor& E,
                                              const Tensor& targets, const Tensor& workspace,
                                              const CrossEntropyOptions& opt) {
  constexpr std::string_view op = "cross_entropy_tied_forward";
  const OpDevice on(op, {{"h", h}, {"E", E}, {"targets", targets}, {"lse", lse}, {"workspace", workspace}});
  check_tied_args(op, h, E, targets, lse, workspace, opt);
  if (on.cpu()) return cpu::cross_entropy_tied_forward(lse, h, E, targets, workspace, opt);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cross_entropy_tied_forward(lse, h, E, targets, workspace, opt);
#endif
  on.no_kernel();
}

CrossEntropyResult cross_entropy_tied_forward_backward(const Tensor& dh, const Tensor& dE,
                                                       const Tensor& lse, const Tensor& h,
                                                       const Tensor& E, const Tensor& targets,
                                                       const Tensor& workspace,
                                                       const CrossEntropyOptions& opt) {
  constexpr std::string_view op = "cross_entropy_tied_forward_backward";
  const OpDevice on(op, {{"h", h},
                         {"E", E},
                         {"targets", targets},
                         {"dh", dh},
                         {"dE", dE},
                         {"lse", lse},
                         {"workspace", workspace}});
  check_tied_args(op, h, E, targets, lse, workspace, opt);
  check::f32(op, "dh", dh);
  check::same_shape(op, "dh", dh, "h", h);
  check::f32(op, "dE", dE);
  check::same_shape(op, "dE", dE, "E", E);
  if (on.cpu()) return cpu::cross_entropy_tied_forward_backward(dh, dE, lse, h, E, targets, workspace, opt);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cross_entropy_tied_forward_backward(dh, dE, lse, h, E, targets, workspace, opt);
#endif
  on.no_kernel();
}

CrossEntropyResult cross_entropy_tied_forward_bf16(const Tensor& lse, const Tensor& h16, const Tensor& E16,
                                                   const Tensor& targets, const Tensor& workspace,
                                                   const CrossEntropyOptions& opt) {
  constexpr std::string_view op = "cross_entropy_tied_forward_bf16";
  const OpDevice on(op,
                    {{"h16", h16}, {"E16", E16}, {"targets", targets}, {"lse", lse}, {"workspace", workspace}});
  check_tied_args(op, h16, E16, targets, lse, workspace, opt, DType::bf16);
  if (on.cpu()) return cpu::cross_entropy_tied_forward_bf16(lse, h16, E16, targets, workspace, opt);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cross_entropy_tied_forward_bf16(lse, h16, E16, targets, workspace, opt);
#endif
  on.no_kernel();
}

CrossEntropyResult cross_entropy_tied_forward_backward_bf16(const Tensor& dh, const Tensor& dE,
                                                            const Tensor& lse, const Tensor& h16,
                                                            const Tensor& E16, const Tensor& targets,
                                                            const Tensor& workspace, const Tensor& g16,
                                                            const CrossEntropyOptions& opt) {
  constexpr std::string_view op = "cross_entropy_tied_forward_backward_bf16";
  const OpDevice on(op, {{"h16", h16},
                         {"E16", E16},
                         {"targets", targets},
                         {"dh", dh},
                         {"dE", dE},
                         {"lse", lse},
                         {"workspace", workspace},
                         {"g16", g16}});
  check_tied_args(op, h16, E16, targets, lse, workspace, opt, DType::bf16);
  check::f32(op, "dh", dh);
  check::same_shape(op, "dh", dh, "h16", h16);
  check::f32(op, "dE", dE);
  check::same_shape(op, "dE", dE, "E16", E16);
  check::dtype(op, "g16", g16, DType::bf16);
  const int64_t need = h16.size(0) * std::min(opt.chunk, E16.size(0));
  ZAYA_CHECK(g16.numel() >= need, op, ": g16 has ", g16.numel(),
             " elements, needs N x min(chunk, V) = ", need);
  if (on.cpu())
    return cpu::cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, targets, workspace, g16, opt);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda())
    return cuda::cross_entropy_tied_forward_backward_bf16(dh, dE, lse, h16, E16, targets, workspace, g16,
                                                          opt);
#endif
  on.no_kernel();
}

CrossEntropyResult cross_entropy_logits_forward(const Tensor& lse, const Tensor& logits,
                                                const Tensor& targets, int32_t ignore_index) {
  constexpr std::string_view op = "cross_entropy_logits_forward";
  const OpDevice on(op, {{"logits", logits}, {"targets", targets}, {"lse", lse}});
  check_logits_args(op, logits, lse, targets);
  if (on.cpu()) return cpu::cross_entropy_logits_forward(lse, logits, targets, ignore_index);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cross_entropy_logits_forward(lse, logits, targets, ignore_index);
#endif
  on.no_kernel();
}

void cross_entropy_logits_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                   int64_t count, int32_t ignore_index) {
  constexpr std::string_view op = "cross_entropy_logits_backward";
  const OpDevice on(op, {{"logits", logits}, {"lse", lse}, {"targets", targets}});
  check_logits_args(op, logits, lse, targets);
  ZAYA_CHECK(count > 0, op, ": count must be positive, found ", count);
  if (on.cpu()) return cpu::cross_entropy_logits_backward(logits, lse, targets, count, ignore_index);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::cross_entropy_logits_backward(logits, lse, targets, count, ignore_index);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
