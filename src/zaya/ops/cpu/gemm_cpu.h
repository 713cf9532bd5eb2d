// The CPU GEMMs behind zaya/ops/gemm.h, and what only the CPU has: switches that pick among its
// paths (AMX, the AVX2-only paths, side-by-side grouped calls, taken pieces), the side-by-side plan
// and one-thread calls for callers that run their own thread loop (the model's fused experts), and
// the GEMM time and primitive-cache counters. docs/ops-gemm.md has the reasons.
//
// The time counters are CPU-only: they add up the wall time of synchronous calls, which on a GPU
// would measure kernel launches, not GEMMs (a CUDA backend times with events or a profiler).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zaya/ops/gemm.h"
#include "zaya/ops/gemm_checks.h"

namespace zaya::ops::cpu {

// The kernels of the fronts ops::gemm and ops::gemm_grouped (arguments checked there; d from
// check_gemm_problem).
void gemm(const GemmDims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C,
          float alpha, float beta);
void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta);

// Whether ops::gemm_grouped would run these problems side by side, one whole GEMM per thread (on this
// many threads, for these shapes; docs/ops-gemm.md), for callers that run their own per-problem
// loop (the model's fused experts):
//   possible  they could run one per thread at all: small weights, no overlapping outputs, two or
//             more problems with work and two or more threads, outside a parallel region; `order`
//             then holds them largest first (indices into problems, those with nothing to do left
//             out), else it is empty;
//   balanced  gemm_grouped itself runs them so: at least as many problems as threads, and the
//             largest-first plan keeps the busiest thread within 1.2× of the mean;
//   few       no more problems than threads.
struct SideBySidePlan {
  bool possible = false, balanced = false, few = false;
};
// Checks the problems as ops::gemm_grouped does (CPU tensors).
SideBySidePlan gemm_grouped_side_by_side_plan(std::span<GemmProblem> problems, Trans ta, Trans tb,
                                              std::vector<size_t>& order);

// Rows of each of `count` row pieces of an m-row product but the last, which takes the rest
// (at least m / count rows): a multiple of 8, or m for one piece. The grouped calls' row pieces and
// the model's fused expert pieces cut rows this way.
inline int64_t row_piece_step(int64_t m, int64_t count) { return count == 1 ? m : m / count / 8 * 8; }

// f32 problems one after another on the calling thread, each through the one-thread path a
// side-by-side grouped call gives it: the same bits as gemm_grouped there, and on any thread
// count. For callers that run their own parallel loop over experts (the model's fused expert
// pipeline, docs/model.md). Checks the problems as ops::gemm_grouped does (CPU tensors). Not added to
// the GEMM time counters, since calls on several threads
// overlap: such a caller records its loop with gemm_time_record.
void gemm_grouped_on_this_thread(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha = 1.0f,
                                 float beta = 0.0f);

// bf16 grouped calls run on zaya's own AMX kernel where the CPU has AMX-BF16 and the call fits it
// (alpha 1, beta 0 or 1, the weight's N a multiple of 16, K a multiple of 32 for x·Wᵀ and dy·W);
// otherwise, and with this set off, through oneDNN as above. On by default; the switch is for
// benchmarks and tests that compare the two.
void gemm_use_amx(bool on);

// The paths for CPUs without AVX-512 (docs/ops-gemm.md, "AVX2-only CPUs"): bf16 operands widened
// to f32, and every oneDNN GEMM run as pieces fixed by its shape on one-thread primitives, so that
// results do not depend on the thread count. Taken automatically where oneDNN has no bf16 matmul /
// is below avx512_core; this switch forces them on any CPU (tests check them everywhere). Off by
// default (automatic).
void gemm_force_avx2_paths(bool on);

// Whether those AVX2-only paths are in use (automatically or forced).
bool gemm_avx2_paths();

// Whether bf16 operands reach a bf16 kernel (false: gemm widens them to f32 first, exactly). A
// caller that rounds its own inputs to bf16 can then keep them as f32 holding bf16 values and skip
// both the narrowing and the widening: the same products, the same bits.
bool gemm_bf16_native();

// Grouped calls on the oneDNN paths run similar-size problems side by side, one whole
// single-thread GEMM per thread (docs/ops-gemm.md); off, each problem runs on all threads in turn.
// On by default; the switch is for benchmarks that compare the two.
void gemm_grouped_side_by_side(bool on);

// Plain f32 products on the avx512_core paths that are large enough run as pieces fixed by their
// shape, taken by the threads as they free up, instead of oneDNN's even split (docs/ops-gemm.md,
// "Taken pieces"). On by default; off for A/B runs and for the test that compares the two.
void gemm_taken_pieces(bool on);

// bf16 grouped calls that zaya's AMX kernel does not take run on oneDNN through fixed-shape
// primitives (row blocks for x·Wᵀ and dy·W with small weights, a zero-padded token dim for large
// weight gradients) where oneDNN's own bf16 kernels use AMX, since only its fixed-shape primitives
// do; elsewhere (AVX-512 BF16 without AMX, e.g. AMD Zen 4) through runtime-dims primitives, which
// run the same kernels there without the copies (docs/ops-gemm.md). This switch forces the
// fixed-shape paths on any CPU, so that tests check them everywhere. Off by default (automatic).
void gemm_force_bf16_fixed_shapes(bool on);

// Primitive cache statistics, for tests and benchmarks.
struct GemmCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t size = 0;
};
GemmCacheStats gemm_cache_stats();
void gemm_cache_clear();

// Wall time spent in gemm() and gemm_grouped() since the last reset, and the FLOPs they ran
// (2·M·N·K per problem): the GEMM part of a training step, for benchmarks and profiles.
struct GemmTimeStats {
  int64_t calls = 0;
  double seconds = 0.0;
  double flops = 0.0;
  // Grouped calls whose problems ran side by side (one whole GEMM per thread), and the summed
  // time between the first and the last thread finishing them: the threads' idle time there.
  int64_t side_by_side_calls = 0;
  double side_by_side_gap_seconds = 0.0;
};
GemmTimeStats gemm_time_stats();
void gemm_time_reset();
// Adds one call of a GEMM that ran outside gemm() / gemm_grouped() (the loss's fused tied head) to
// the counters above, under `shape` when profiling shapes.
void gemm_time_record(const std::string& shape, double seconds, double flops);

// The same per shape, when enabled (off by default: a map lookup under a lock per call). A plain
// GEMM's shape is "NT 2048x768x256 f32" (op letters, M x N x K, A's dtype); a grouped call's is
// "grouped NT ?x1024x256 bf16" with ? for the token dim, which changes per problem. Sorted by
// seconds, largest first; gemm_time_reset() clears it too.
struct GemmShapeTime : GemmTimeStats {
  std::string shape;
};
void gemm_profile_shapes(bool on);
std::vector<GemmShapeTime> gemm_shape_times();

}  // namespace zaya::ops::cpu
