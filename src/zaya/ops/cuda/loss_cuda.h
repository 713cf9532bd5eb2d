// CUDA cross-entropy behind zaya/ops/loss.h (loss.cu), with the fronts' signatures; the fronts in
// ops/loss.cc check the arguments and call these for CUDA tensors. A plain C++ header (no CUDA
// types), included only where the build has CUDA (ZAYA_HAVE_CUDA).
//
// The logits GEMMs go through the device-neutral ops::gemm front; the row statistics and the
// softmax-minus-one-hot gradient are this file's kernels. Each forward returns the loss to the host,
// so it synchronizes once, at its end; a target outside [0, V) that is not the ignore index throws
// zaya::Error naming the first such row there (lse already written, dh and dE not yet touched), as
// the CPU kernels do before they start. The logits backward trusts its targets, as on the CPU.
#pragma once

#include "zaya/ops/loss.h"

namespace zaya::ops::cuda {

CrossEntropyResult cross_entropy_tied_forward(const Tensor& lse, const Tensor& h, const Tensor& E,
                                              const Tensor& targets, const Tensor& workspace,
                                              const CrossEntropyOptions& opt);
CrossEntropyResult cross_entropy_tied_forward_backward(const Tensor& dh, const Tensor& dE, const Tensor& lse,
                                                       const Tensor& h, const Tensor& E,
                                                       const Tensor& targets, const Tensor& workspace,
                                                       const CrossEntropyOptions& opt);
CrossEntropyResult cross_entropy_tied_forward_backward_bf16(const Tensor& dh, const Tensor& dE,
                                                            const Tensor& lse, const Tensor& h16,
                                                            const Tensor& E16, const Tensor& targets,
                                                            const Tensor& workspace, const Tensor& g16,
                                                            const CrossEntropyOptions& opt);
CrossEntropyResult cross_entropy_tied_forward_bf16(const Tensor& lse, const Tensor& h16, const Tensor& E16,
                                                   const Tensor& targets, const Tensor& workspace,
                                                   const CrossEntropyOptions& opt);
CrossEntropyResult cross_entropy_logits_forward(const Tensor& lse, const Tensor& logits,
                                                const Tensor& targets, int32_t ignore_index);
void cross_entropy_logits_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                   int64_t count, int32_t ignore_index);

}  // namespace zaya::ops::cuda
