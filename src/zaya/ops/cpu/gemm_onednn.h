// The oneDNN layer under the CPU GEMMs, shared by their two files: gemm_cpu.cc (the primitive
// cache, one product, the pieces) and gemm_grouped_cpu.cc (the expert GEMMs). Internal to ops/cpu;
// callers use zaya/ops/gemm.h (and zaya/ops/cpu/gemm_cpu.h for the CPU-only switches). Each
// function's reasons are at its definition in gemm_cpu.cc.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "zaya/core/parallel.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/gemm_checks.h"

namespace zaya::ops::cpu::gemm_detail {

using dnnl::memory;

// A dim (m or k) given only when a primitive runs: one primitive for every value of it (the
// grouped expert GEMMs, whose token counts change every step).
constexpr int64_t kRuntime = -1;

// Everything that changes the primitive oneDNN builds. The thread count is part of it because
// oneDNN fixes its work partition (and so the reduction order) when the primitive is created.
// lda/ldb/ldc: row strides of 2-D operands that are blocks of larger matrices (the row pieces of
// run_pieces); 0 for dense operands.
struct Key {
  int64_t batch_a, batch_b, m, n, k;
  uint8_t ta, tb, dtype;
  uint32_t alpha_bits, beta_bits;
  int threads;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool operator==(const Key&) const = default;
};

// A built matmul and the scratchpad bytes it needs. Every primitive takes its scratchpad from the
// caller (scratchpad_mode::user): oneDNN's own, in the default library mode, is one buffer shared
// by all primitives, which two threads running GEMMs side by side (gemm_grouped) would corrupt.
struct Primitive {
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
  explicit operator bool() const { return static_cast<bool>(prim); }
};

// The checked dims of one C = op(A)·op(B) problem (the fronts check; gemm_checks.h).
using Dims = GemmDims;

double flops_of(int64_t batch, int64_t m, int64_t n, int64_t k);

// --- the GEMM time counters (gemm_time_stats) ---------------------------------------------------
std::string shape_label(bool grouped, Trans ta, Trans tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                        DType dt);
// Adds one call's wall time and FLOPs to the counters, and to its shape's row when `label` is not
// empty.
void record_call(int64_t ns, double flops, const std::string& label);
bool profiling_shapes();
// Adds one side-by-side grouped call and the spread of its threads' finishing times.
void record_side_by_side(int64_t gap_ns);

// Adds one call's wall time and FLOPs on scope exit (and to its shape's row when profiling;
// the label is only built then).
class TimedCall {
 public:
  TimedCall() : t0_(std::chrono::steady_clock::now()) {}
  void add_flops(double f) { flops_ += f; }
  bool wants_label() const { return profiling_shapes(); }
  void set_label(std::string s) { label_ = std::move(s); }
  // A call from inside a parallel region (a side task of the model's fused experts) runs on one
  // of the region's threads while the others work: it counts its share of the wall time, as the
  // fused experts' own GEMMs do (their thread time over the threads), so the GEMM total stays a
  // part of the step's wall time. Its shape row is kept apart ("beside other work").
  ~TimedCall() {
    int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
    if (omp_in_parallel()) {
      ns /= omp_get_num_threads();
      if (!label_.empty()) label_ += " beside other work";
    }
    record_call(ns, flops_, label_);
  }

 private:
  std::chrono::steady_clock::time_point t0_;
  double flops_ = 0.0;
  std::string label_;
};

// --- primitives: descriptors, the cache, execution ----------------------------------------------
// op(X) of shape [rows, cols] for a row-major X, possibly batched (a transpose is a stride swap).
memory::desc operand_desc(int64_t batch, int64_t rows, int64_t cols, Trans t, memory::data_type dt);
// The same for one 2-D operand whose dims may be kRuntime.
memory::desc operand_desc_2d(int64_t rows, int64_t cols, Trans t, memory::data_type dt);
// op(X) for a 2-D block whose rows lie `ld` elements apart (0: dense, operand_desc).
memory::desc block_desc(int64_t rows, int64_t cols, Trans t, int64_t ld, memory::data_type dt);
memory::data_type dnnl_type(uint8_t dtype);
Key make_key(const Dims& d, Trans ta, Trans tb, DType dt, float alpha, float beta, int threads);
// The cached primitive for k, built on a miss; for runtime dims an empty handle where oneDNN only
// has a reference implementation.
Primitive lookup(const Key& k);
// Runs p on the calling thread's stream with its own scratchpad; returns when C is written.
void execute(const Primitive& p, const memory::desc& a, const void* ap, const memory::desc& b, const void* bp,
             const memory::desc& c, void* cp);

// --- problems -------------------------------------------------------------------------------------
// Handles the empty cases; true when nothing is left for oneDNN to do.
bool trivial(const Dims& d, const Tensor& C, float beta);
// A checked, non-trivial problem through the primitive built for exactly its shape.
void run_fixed(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C,
               float alpha, float beta, int threads);
// One problem: run_pieces where oneDNN's results depend on the thread count, otherwise taken
// pieces or run_fixed.
void run_plain(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C,
               float alpha, float beta, int threads);

// --- what oneDNN offers on this CPU ---------------------------------------------------------------
bool bf16_matmul_native();
bool onednn_isa_includes(dnnl::cpu_isa want);
// True on CPUs without avx512_core (or when forced): oneDNN's results there depend on the thread
// count, so every GEMM runs as pieces fixed by its shape.
bool threads_change_bits();

// --- pieces (AVX2-only CPUs) ------------------------------------------------------------------------
// Outside a parallel region oneDNN runs a primitive on omp_get_max_threads() threads, whatever
// thread count it was built for; this holds the calling thread to one for the guard's life (inside
// a region it runs on the calling thread alone anyway).
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

// Runs pieces 0..count−1, each on one thread: in order on this thread (one thread, one piece, or
// already inside a parallel region), otherwise taken in turn by up to `threads` threads.
template <class RunOne>
void run_pieces_in_turn(size_t count, int threads, RunOne&& run_one) {
  if (threads < 2 || count < 2 || omp_in_parallel()) {
    OneThread one;
    for (size_t j = 0; j < count; ++j) run_one(j);
    return;
  }
  take_in_turn(count, std::min<int>(threads, static_cast<int>(count)), run_one);
}

// oneDNN 2.6's AVX2 sgemm runs on its no-copy kernels where 1/m + 1/n reaches this (gemm_cpu.cc).
constexpr double kForceNoCopy = 0.0038;
// A 2-D problem's larger output dim (or M alone) cut into `count` spans of `step`.
struct Pieces {
  bool along_m;
  int64_t step, count;
};
Pieces pieces_of(const Dims& d, bool m_only = false);
// Whether op(X) (X = A when is_a) of a no-copy product is read from a padded copy at row stride ld.
bool pads_operand(Trans ta, Trans tb, bool is_a, int64_t ld);
// The block rows × cols at src copied to this thread's scratch `slot` with a padded row stride,
// which is returned; *dst points at the copy.
int64_t copy_padded(const char* src, int64_t rows, int64_t cols, int64_t ld, int64_t es, int slot,
                    const char** dst);
// The problem as pieces fixed by its shape, each on one thread.
void run_pieces(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C,
                float alpha, float beta, int threads);

// x's bf16 elements as f32 at dst (exact), as a tensor of x's shape over dst.
Tensor widen_into(const Tensor& x, float* dst);

}  // namespace zaya::ops::cpu::gemm_detail
