// CPU cross-entropy behind zaya/ops/loss.h, with the same signatures as the fronts there (which
// check the arguments and call these for CPU tensors), and the CPU-only fused-head switch.
#pragma once

#include "zaya/ops/loss.h"

namespace zaya::ops::cpu {

// The workspace the CPU kernels need (ops::cross_entropy_workspace_elems is this).
int64_t cross_entropy_workspace_elems(int64_t n, int64_t vocab, const CrossEntropyOptions& opt);

// These read the targets on the host and throw zaya::Error naming one outside [0, V) that is not
// the ignore index (cross_entropy_logits_backward takes them as cross_entropy_logits_forward
// checked them).
CrossEntropyResult cross_entropy_tied_forward(const Tensor& lse, const Tensor& h, const Tensor& E,
                                              const Tensor& targets, const Tensor& workspace,
                                              const CrossEntropyOptions& opt);
CrossEntropyResult cross_entropy_tied_forward_backward(const Tensor& dh, const Tensor& dE,
                                                       const Tensor& lse, const Tensor& h,
                                                       const Tensor& E, const Tensor& targets,
                                                       const Tensor& workspace,
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

// The fused head is on by default where built; off, the single-chunk case runs on row-major logits
// and library GEMMs (tests and benchmarks compare the two).
void cross_entropy_use_fused_head(bool on);

}  // namespace zaya::ops::cpu
