// CPU chunked cross-entropy over the tied LM head (see loss.h for the math and the memory argument;
// arguments checked by the fronts in ops/loss.cc).
#include "zaya/ops/cpu/loss_cpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>

#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/cpu/seq_vec.h"
#include "zaya/ops/cpu/tied_head_cpu.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/loss_math.h"

namespace zaya::ops::cpu {
namespace {

struct Dims {
  int64_t n, h, vocab, chunk;
  bool fused;  // the kept-exps case on the fused head: decided once per call (dims_of)
  bool keep;   // the forward keeps exp(logit − max) for the backward (keeps_exps)
};

std::atomic<bool> g_fused_head{true};  // cross_entropy_use_fused_head

// The kept-exps case (one chunk covers V) runs on the fused head (cpu/tied_head_cpu.h) where the
// build has it: e in the strip layout, which may need a little more room than [N, V] (N and V
// rounded up to 16).
bool fused_head_fits(int64_t vocab, int64_t chunk) {
  return chunk >= vocab && cpu::tied_head_fused_built();
}

// f32 elements of the workspace before its two [N] row buffers.
int64_t logits_area(int64_t n, int64_t vocab, int64_t chunk) {
  const int64_t rows = n * std::min(chunk, vocab);
  return fused_head_fits(vocab, chunk) ? std::max(rows, cpu::tied_head_strip_elems(n, vocab)) : rows;
}

// The call's dims, after the targets' range check (they are read here, on the host).
Dims dims_of(const char* op, const Tensor& h, const Tensor& E, const Tensor& targets, const CrossEntropyOptions& opt) {
  Dims d{h.size(0), h.size(1), E.size(0), std::min(opt.chunk, E.size(0)),
         fused_head_fits(E.size(0), opt.chunk) && g_fused_head.load(std::memory_order_relaxed),
         /*keep=*/opt.chunk >= E.size(0)};
  const int32_t* t = targets.data<int32_t>();
  for (int64_t i = 0; i < d.n; ++i)
    ZAYA_CHECK(t[i] == opt.ignore_index || (t[i] >= 0 && t[i] < d.vocab), op, ": target ", t[i], " at row ", i,
               " is outside [0, ", d.vocab, ") and is not the ignore index ", opt.ignore_index);
  return d;
}

// Logits of vocabulary rows [v0, v0 + c) for every token, into the workspace's chunk buffer.
Tensor chunk_logits(const Tensor& h, const Tensor& E, const Tensor& workspace, const Dims& d, int64_t v0,
                    int64_t c) {
  Tensor logits = workspace.window(0, Shape{d.n, c});
  ops::gemm(logits, h, Trans::N, E.slice(v0, v0 + c), Trans::T, 1.0f, 0.0f);
  return logits;
}

// Probabilities (exp(logit − max), ≤ 1) below cpu::kTinyProbability (2^-100) are stored as 0
// wherever they feed the head's GEMMs. Kept, they make those GEMMs multiply numbers whose products
// fall below float's normal range (2^-126), which x86 cores run through microcode assists: the demo
// head's backward GEMMs ran at 7 instead of ~150 GFLOP/s with logits spread over ~90 nats
// (bench_ops_dense's random head). Dropped, each changes a gradient sum whose largest term is ≥ 1/V
// of the row's by < 2^-100: far below float resolution. It is a per-op, deterministic
// flush-to-zero; no FP mode is changed.
using cpu::kTinyProbability;
static_assert(kTinyProbability == math::kTinyProbability, "the CUDA kernels flush at the CPU's threshold");
constexpr cpu::FlushBelow flush_tiny{kTinyProbability};

// When one chunk covers the vocabulary, the f32 forward keeps what the backward needs instead of
// making it again: the workspace's logits become e = exp(logit − row max) in place and `sum` holds
// Σ_j e. (The bf16 head keeps the logits themselves: its backward rounds G, not e, to bf16.)
bool keeps_exps(const Dims& d) { return d.keep; }

// The fused head's products in cpu::gemm_time_stats (the step's GEMM share): `products` [N × V × H]
// products that ran since t0.
void record_fused(const std::string& shape, std::chrono::steady_clock::time_point t0, int products, const Dims& d) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gemm_time_record(shape, seconds,
                   2.0 * products * static_cast<double>(d.n) * static_cast<double>(d.vocab) * static_cast<double>(d.h));
}

// The two [N] row buffers after the logits area: Σexp per row, then the target's logit.
float* row_sums(const Tensor& workspace, const Dims& d) {
  return workspace.data<float>() + logits_area(d.n, d.vocab, d.chunk);
}

// The row-major forward: logits chunk by chunk (oneDNN), each row's running max and Σexp carried
// across chunks; with kept exps the single chunk's logits become e = exp(logit − max) in place.
void row_major_forward(const Tensor& h, const Tensor& E, const int32_t* tgt, const Tensor& workspace, const Dims& d,
                       float* run_max, float* sum, float* picked) {
  const bool keep = keeps_exps(d);
  for (int64_t v0 = 0; v0 < d.vocab; v0 += d.chunk) {
    // One GEMM for the whole chunk: 256-row blocks (so the softmax would read rows still in
    // cache) cost 88 instead of 60 ms at 2 threads for the demo head.
    const int64_t c = std::min(d.chunk, d.vocab - v0);
    float* lp = chunk_logits(h, E, workspace, d, v0, c).data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.n; ++i) {
      float* row = lp + i * c;
      const float cm = cpu::maxf(row, c);
      if (tgt[i] >= v0 && tgt[i] < v0 + c) picked[i] = row[tgt[i] - v0];
      // Rescale the old sum to the new max before adding this chunk: Σexp(l − m) stays ≤ V.
      if (cm > run_max[i]) {
        sum[i] *= std::exp(run_max[i] - cm);  // exp(−inf) = 0 on the first chunk
        run_max[i] = cm;
      }
      // The next row is read from memory by the next maxf: start fetching it now (the rows are
      // 32 KiB at the demo's V; static scheduling gives each thread a contiguous run of them).
      const float* next = i + 1 < d.n ? lp + (i + 1) * c : nullptr;
      sum[i] += keep ? cpu::exp_store_sum(row, row, c, run_max[i], next, cpu::FlushBelow{kTinyProbability})
                     : cpu::sum_expf(row, c, run_max[i]);
    }
  }
}

CrossEntropyResult forward_impl(const Tensor& h, const Tensor& E, const Tensor& targets, const Tensor& lse,
                                const Tensor& workspace, const CrossEntropyOptions& opt, const Dims& d) {
  const int32_t* tgt = targets.data<int32_t>();
  // Row state between chunks: running max in lse (until the end), running Σexp in `sum`, the
  // target's logit in `picked`. Both [N] buffers live after the logits chunk in the workspace.
  float* run_max = lse.data<float>();
  float* sum = row_sums(workspace, d);
  float* picked = sum + d.n;
  std::fill_n(run_max, d.n, -INFINITY);
  std::fill_n(sum, d.n, 0.0f);
  std::fill_n(picked, d.n, 0.0f);
  if (d.fused) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::tied_head_forward(workspace.data<float>(), run_max, sum, picked, h.data<float>(), E.data<float>(), tgt, d.n,
                           d.h, d.vocab, kTinyProbability);
    // Counted with the step's GEMMs (its softmax included: the two are interleaved).
    record_fused(str("fused head NT ", d.n, "x", d.vocab, "x", d.h, " f32 (+ softmax)"), t0, 1, d);
  } else {
    row_major_forward(h, E, tgt, workspace, d, run_max, sum, picked);
  }
  CrossEntropyResult r;
  double total = 0;
  for (int64_t i = 0; i < d.n; ++i) {  // in row order: the loss is bitwise reproducible
    run_max[i] += std::log(sum[i]);     // now the logsumexp
    if (tgt[i] == opt.ignore_index) continue;
    total += static_cast<double>(run_max[i]) - static_cast<double>(picked[i]);
    ++r.count;
  }
  r.loss = r.count ? total / static_cast<double>(r.count) : 0.0;
  return r;
}

// Backward from the kept exponentials (one chunk covers V), with no pass over the [N, V] matrix:
// G = diag(r)·e − onehot/count with r_i = 1/(count·Σ_j e_ij) (0 for ignored rows), so
//   dh = G·E   = r ⊙ (e·E) − E[t]/count        (row i: r_i·(e·E)_i − E[t_i]/count)
//   dE += Gᵀ·h = eᵀ·(r ⊙ h) − Σ_i onehot(t_i)·h_iᵀ/count
// The one-hot part is an [N, H] correction, subtracted after the GEMM rather than folded into G. Its
// rounding is the same size as forming softmax − 1 in f32 (absolute ~ulp(1)/count per token).
void backward_kept(const Tensor& h, const Tensor& E, const Tensor& targets, const Tensor& dh, const Tensor& dE,
                   const Tensor& workspace, const CrossEntropyOptions& opt, const Dims& d, int64_t count) {
  const int32_t* tgt = targets.data<int32_t>();
  const float* sum = row_sums(workspace, d);
  const float inv_count = 1.0f / static_cast<float>(count);
  const float* hp = h.data<float>();
  const float* Ep = E.data<float>();
  float* dhp = dh.data<float>();
  float* dEp = dE.data<float>();
  const int64_t H = d.h;
  if (d.fused) {  // both products from the strip layout; r in the (no longer needed) picked buffer
    float* r = row_sums(workspace, d) + d.n;
    for (int64_t i = 0; i < d.n; ++i) r[i] = tgt[i] == opt.ignore_index ? 0.0f : inv_count / sum[i];
    const auto t0 = std::chrono::steady_clock::now();
    cpu::tied_head_backward_gemms(dEp, dhp, workspace.data<float>(), hp, r, Ep, d.n, H, d.vocab,
                                  kTinyProbability);
    record_fused(str("fused head TN ", d.vocab, "x", H, "x", d.n, " + NN ", d.n, "x", H, "x", d.vocab, " f32"), t0, 2,
                 d);
  } else {
    // dh's storage first holds r ⊙ h (the dE GEMM's right operand), then dh itself.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.n; ++i) {
      const float r = tgt[i] == opt.ignore_index ? 0.0f : inv_count / sum[i];
      for (int64_t k = 0; k < H; ++k) dhp[i * H + k] = r * hp[i * H + k];
    }
    ops::gemm(dE, workspace.window(0, Shape{d.n, d.vocab}), Trans::T, dh, Trans::N, 1.0f, 1.0f);
  }
  // Rows in order, one writer per column block: deterministic when two tokens share a target.
#pragma omp parallel for schedule(static)
  for (int64_t k0 = 0; k0 < H; k0 += 16)
    for (int64_t i = 0; i < d.n; ++i) {
      if (tgt[i] == opt.ignore_index) continue;
      for (int64_t k = k0; k < std::min(H, k0 + 16); ++k) dEp[tgt[i] * H + k] -= hp[i * H + k] * inv_count;
    }
  if (!d.fused) ops::gemm(dh, workspace.window(0, Shape{d.n, d.vocab}), Trans::N, E, Trans::N, 1.0f, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < d.n; ++i) {
    float* row = dhp + i * H;
    if (tgt[i] == opt.ignore_index) {
      std::fill_n(row, H, 0.0f);
      continue;
    }
    const float r = inv_count / sum[i];
    const float* et = Ep + tgt[i] * H;
    for (int64_t k = 0; k < H; ++k) row[k] = r * row[k] - et[k] * inv_count;
  }
}

}  // namespace

int64_t cross_entropy_workspace_elems(int64_t n, int64_t vocab, const CrossEntropyOptions& opt) {
  return logits_area(n, vocab, opt.chunk) + 2 * n;
}

void cross_entropy_use_fused_head(bool on) { g_fused_head.store(on, std::memory_order_relaxed); }

CrossEntropyResult cross_entropy_tied_forward(const Tensor& lse, const Tensor& h, const Tensor& E,
                                              const Tensor& targets, const Tensor& workspace,
                                              const CrossEntropyOptions& opt) {
  Dims d = dims_of("cross_entropy_tied_forward", h, E, targets, opt);
  return forward_impl(h, E, targets, lse, workspace, opt, d);
}

// d loss / d logit[n, v] = (softmax[n, v] − [v == t_n]) / count for counted rows, 0 for ignored.
// dh = G·E (G the [N, V] matrix of those, chunk by chunk), dE += Gᵀ·h.
CrossEntropyResult cross_entropy_tied_forward_backward(const Tensor& dh, const Tensor& dE, const Tensor& lse,
                                                       const Tensor& h, const Tensor& E, const Tensor& targets,
                                                       const Tensor& workspace, const CrossEntropyOptions& opt) {
  Dims d = dims_of("cross_entropy_tied_forward_backward", h, E, targets, opt);
  CrossEntropyResult r = forward_impl(h, E, targets, lse, workspace, opt, d);
  if (r.count == 0) {  // nothing to learn from: zero dh, leave dE alone, no 0/0
    std::fill_n(dh.data<float>(), dh.numel(), 0.0f);
    return r;
  }
  if (keeps_exps(d)) {
    backward_kept(h, E, targets, dh, dE, workspace, opt, d, r.count);
    return r;
  }
  const int32_t* tgt = targets.data<int32_t>();
  const float* lp_lse = lse.data<float>();
  const float inv_count = 1.0f / static_cast<float>(r.count);
  for (int64_t v0 = 0; v0 < d.vocab; v0 += d.chunk) {
    int64_t c = std::min(d.chunk, d.vocab - v0);
    Tensor g = chunk_logits(h, E, workspace, d, v0, c);
    float* gp = g.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.n; ++i) {
      float* row = gp + i * c;
      if (tgt[i] == opt.ignore_index) {
        std::fill_n(row, c, 0.0f);
        continue;
      }
      for (int64_t j = 0; j < c; ++j) row[j] = flush_tiny(cpu::expf_fast(row[j] - lp_lse[i])) * inv_count;
      if (tgt[i] >= v0 && tgt[i] < v0 + c) row[tgt[i] - v0] -= inv_count;
    }
    Tensor e_chunk = E.slice(v0, v0 + c);
    ops::gemm(dh, g, Trans::N, e_chunk, Trans::N, 1.0f, v0 == 0 ? 0.0f : 1.0f);
    ops::gemm(dE.slice(v0, v0 + c), g, Trans::T, h, Trans::N, 1.0f, 1.0f);
  }
  return r;
}

namespace {

// The chunk's logits made into G = (softmax − onehot)/count in place, rows whose target is ignored
// zeroed: cross_entropy_logits_backward's row math, on vocabulary columns [v0, v0 + c).
void logits_to_grad(float* gp, const float* lse, const int32_t* tgt, int64_t n, int64_t c, int64_t v0,
                    float inv_count, int32_t ignore_index) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* row = gp + i * c;
    if (tgt[i] == ignore_index) {
      std::fill_n(row, c, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < c; ++j) row[j] = flush_tiny(cpu::expf_fast(row[j] - lse[i])) * inv_count;
    if (tgt[i] >= v0 && tgt[i] < v0 + c) row[tgt[i] - v0] -= inv_count;
  }
}

// The bf16 head's dims: the f32 op's row-major path with bf16 GEMM operands, so no fused head (its
// kernels are f32) and no kept exps (the backward needs G itself in bf16). Its forward alone and its
// forward-backward both run forward_impl with these, hence the same loss and lse bit for bit.
Dims bf16_head_dims(const char* op, const Tensor& h16, const Tensor& E16, const Tensor& targets,
                    const CrossEntropyOptions& opt) {
  Dims d = dims_of(op, h16, E16, targets, opt);
  d.fused = false;
  d.keep = false;
  return d;
}

}  // namespace

CrossEntropyResult cross_entropy_tied_forward_bf16(const Tensor& lse, const Tensor& h16, const Tensor& E16,
                                                   const Tensor& targets, const Tensor& workspace,
                                                   const CrossEntropyOptions& opt) {
  const Dims d = bf16_head_dims("cross_entropy_tied_forward_bf16", h16, E16, targets, opt);
  return forward_impl(h16, E16, targets, lse, workspace, opt, d);
}

// With one chunk the forward's logits are still in the workspace for the backward; with several,
// each chunk's are made again.
CrossEntropyResult cross_entropy_tied_forward_backward_bf16(const Tensor& dh, const Tensor& dE,
                                                            const Tensor& lse, const Tensor& h16,
                                                            const Tensor& E16, const Tensor& targets,
                                                            const Tensor& workspace, const Tensor& g16,
                                                            const CrossEntropyOptions& opt) {
  const Dims d = bf16_head_dims("cross_entropy_tied_forward_backward_bf16", h16, E16, targets, opt);
  const CrossEntropyResult r = forward_impl(h16, E16, targets, lse, workspace, opt, d);
  if (r.count == 0) {  // nothing to learn from: zero dh, leave dE alone, no 0/0
    std::fill_n(dh.data<float>(), dh.numel(), 0.0f);
    return r;
  }
  const float inv_count = 1.0f / static_cast<float>(r.count);
  const bool one_chunk = d.chunk == d.vocab;
  for (int64_t v0 = 0; v0 < d.vocab; v0 += d.chunk) {
    const int64_t c = std::min(d.chunk, d.vocab - v0);
    const Tensor g =
        one_chunk ? workspace.window(0, Shape{d.n, c}) : chunk_logits(h16, E16, workspace, d, v0, c);
    logits_to_grad(g.data<float>(), lse.data<float>(), targets.data<int32_t>(), d.n, c, v0, inv_count,
                   opt.ignore_index);
    const Tensor g_bf16 = g16.window(0, Shape{d.n, c});
    ops::cast_to_bf16(g_bf16, g);
    ops::gemm(dh, g_bf16, Trans::N, E16.slice(v0, v0 + c), Trans::N, 1.0f, v0 == 0 ? 0.0f : 1.0f);
    ops::gemm(dE.slice(v0, v0 + c), g_bf16, Trans::T, h16, Trans::N, 1.0f, 1.0f);
  }
  return r;
}

CrossEntropyResult cross_entropy_logits_forward(const Tensor& lse, const Tensor& logits, const Tensor& targets,
                                                int32_t ignore_index) {
  const char* op = "cross_entropy_logits_forward";
  const int64_t N = logits.size(0), V = logits.size(1);
  const int32_t* tgt = targets.data<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    ZAYA_CHECK(tgt[i] == ignore_index || (tgt[i] >= 0 && tgt[i] < V), op, ": target ", tgt[i], " at row ", i,
               " is outside [0, ", V, ") and is not the ignore index ", ignore_index);
  const float* lp = logits.data<float>();
  float* l = lse.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* row = lp + i * V;
    const float mx = cpu::maxf(row, V);
    l[i] = mx + std::log(cpu::sum_expf(row, V, mx));
  }
  CrossEntropyResult r;
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {  // in row order: bitwise reproducible
    if (tgt[i] == ignore_index) continue;
    total += static_cast<double>(l[i]) - static_cast<double>(lp[i * V + tgt[i]]);
    ++r.count;
  }
  r.loss = r.count ? total / static_cast<double>(r.count) : 0.0;
  return r;
}

void cross_entropy_logits_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t count,
                                   int32_t ignore_index) {
  const int64_t N = logits.size(0), V = logits.size(1);
  float* gp = logits.data<float>();
  const float* l = lse.data<float>();
  const int32_t* tgt = targets.data<int32_t>();
  const float inv_count = 1.0f / static_cast<float>(count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* row = gp + i * V;
    if (tgt[i] == ignore_index) {
      std::fill_n(row, V, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < V; ++j) row[j] = flush_tiny(cpu::expf_fast(row[j] - l[i])) * inv_count;  // vectorizes; libm expf does not
    row[tgt[i]] -= inv_count;
  }
}

}  // namespace zaya::ops::cpu
