// The CPU grouped expert GEMMs (ops::gemm_grouped, gemm.h; arguments checked by the front in
// ops/gemm.cc): one product per expert, each with its own token count, through zaya's AMX kernel or
// oneDNN (the primitive layer in gemm_onednn.h), one expert after another on every thread or side
// by side, one whole expert per thread.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "zaya/core/parallel.h"
#include "zaya/core/threads.h"
#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/amx_gemm.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/cpu/gemm_onednn.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::cpu {
namespace {

using namespace gemm_detail;

// The expert GEMMs see a new token count (M, or K for the weight gradient) almost every step, and
// oneDNN fixes every dim when it builds a primitive (0.4–2 ms here, several times the GEMM of one
// expert). bf16 calls with small weights, and bf16 weight gradients of any size, go to zaya's own
// AMX kernel where the CPU has one (the AMX grouped path below); for everything else (and for
// those where the kernel cannot run), three ways around it, picked per case from
// measurements on the development VM (docs/results/ops-cpu.md; differences under ~15% there are
// within its noise):
//  * Row blocks (token count in M): M is cut into a body of whole kRowBlock-row blocks, through
//    the primitive for that row count (at most tokens / kRowBlock of them over a run), and a tail
//    of fewer than kRowBlock rows, copied into a zero-padded kRowBlock-row scratch and run through
//    the kRowBlock-row primitive. Rows of C are independent, so the padding never reaches a
//    result. Used for bf16 with small expert weights when zaya's AMX kernel does not run on an AMX
//    CPU (N·K < 2^20, the demo's: ~1.4× the runtime-M GEMM, which does not use AMX there; see
//    bf16_fixed_shapes) and f32 with large ones (ZAYA1's 4096 × 2048: ~1.2×).
//    When the next problem's C starts where this one's ends and is overwritten (beta = 0), which
//    is how the model lays out its experts' tokens, the problem instead runs as one GEMM of M
//    rounded up to kRowBlock rows, in place: the extra rows read A's memory past its end (the next
//    expert's tokens) and write rows of C that the next problem then replaces. One execution
//    instead of two halves a small expert's weight reads (demo bf16 gate_up: 3.66 → 3.14 ms).
//  * A runtime-M primitive (oneDNN's jit GEMM), one for every token count: bf16 with large
//    weights (~1.1–1.4× the row blocks at ZAYA1's shapes), f32 with small ones (~1.2×), and every
//    bf16 x·Wᵀ and dy·W on a CPU whose oneDNN has no AMX.
//  * Zero-padded K (token count in K, the weight gradient dyᵀ·x) for bf16 with a large weight
//    gradient (M·N >= 2^20) on an AMX CPU where zaya's AMX kernel does not run: run_k_padded. f32,
//    bf16 with a small one (where the copies cost more than they gain: ~1.1× for the runtime-K
//    primitive), and every bf16 one on a CPU whose oneDNN has no AMX use a runtime-K one.
// Every choice depends only on the problem's shape, so results stay deterministic.
constexpr int64_t kRowBlock = 32;
constexpr int64_t kLargeWeight = int64_t{1} << 20;

// The two bf16 fixed-shape ways (row blocks, zero-padded K) exist because on AMX CPUs oneDNN 2.6
// runs a fixed-shape bf16 primitive on AMX and the runtime-dims jit GEMM without it. Where its
// bf16 kernels are AVX-512 BF16 only (AMD Zen 4), both primitives run the same kernels and the
// copies only cost: on 2 Zen 4 cores (bench_ops_gemm vs_square) the demo's grouped
// gate_up ran at 76–81% of the bf16 square in row blocks and 92–98% at a runtime M, ZAYA1's
// weight gradient at 72–76% with K padded and 86–90% at a runtime K (each way forced by a
// temporary switch; the kept code's runs are in docs/results/ops-cpu.md).
std::atomic<bool> g_force_bf16_fixed_shapes{false};
bool bf16_fixed_shapes() {
  if (g_force_bf16_fixed_shapes.load(std::memory_order_relaxed)) return true;
  static const bool amx = onednn_isa_includes(dnnl::cpu_isa::avx512_core_amx);
  return amx;
}

// Scratch for the padded tail, per thread and reused (grows to the largest tail seen).
template <class T>
struct TailScratch {
  std::vector<T> a;
  std::vector<float> c;
};

// True when problem p (dims d, op(A) = A) may run as `rows` ≥ d.m rows in place: A's storage holds
// the extra rows, and `next` (run right after p) has C beginning at the end of p's C, at least
// the extra rows long, and overwritten (beta = 0). next's A and B cannot overlap its own C
// (check_problem), so the rows written past p's end are nobody's input before next replaces them.
bool may_run_past_end(const Dims& d, const GemmProblem& p, const GemmProblem* next, int64_t rows,
                      float beta) {
  if (beta != 0.0f || next == nullptr || rows == d.m) return false;
  const Tensor& nc = next->C;
  if (nc.ndim() != 2 || nc.size(1) != d.n || nc.size(0) < rows - d.m) return false;
  if (static_cast<const char*>(nc.raw()) != static_cast<const char*>(p.C.raw()) + d.m * d.n * sizeof(float))
    return false;
  const Storage& sa = *p.A.storage();
  const char* a_end =
      static_cast<const char*>(p.A.raw()) + rows * d.k * static_cast<int64_t>(dtype_size(p.A.dtype()));
  return sa.bytes > 0 && a_end <= static_cast<const char*>(sa.ptr) + sa.bytes;
}

template <class T>
void run_row_blocked(const Dims& d, const Tensor& A, const Tensor& B, Trans tb, const Tensor& C, float alpha,
                     float beta, bool past_end_ok, int threads) {
  if (past_end_ok) {  // one GEMM of whole blocks, in place (may_run_past_end)
    const int64_t rows = (d.m + kRowBlock - 1) / kRowBlock * kRowBlock;
    auto dt = dnnl_type(static_cast<uint8_t>(A.dtype()));
    Primitive prim =
        lookup(make_key(Dims{1, 1, rows, d.n, d.k}, Trans::N, tb, A.dtype(), alpha, beta, threads));
    execute(prim, operand_desc(1, rows, d.k, Trans::N, dt), A.raw(), operand_desc(1, d.k, d.n, tb, dt),
            B.raw(), operand_desc(1, rows, d.n, Trans::N, memory::data_type::f32), C.raw());
    return;
  }
  const int64_t body = d.m / kRowBlock * kRowBlock, tail = d.m - body;
  const DType dtype = A.dtype();
  auto dt = dnnl_type(static_cast<uint8_t>(dtype));
  memory::desc b = operand_desc(1, d.k, d.n, tb, dt);
  const T* a = A.data<T>();
  float* c = C.data<float>();
  if (body > 0) {
    Dims db{1, 1, body, d.n, d.k};
    Primitive prim = lookup(make_key(db, Trans::N, tb, dtype, alpha, beta, threads));
    execute(prim, operand_desc(1, body, d.k, Trans::N, dt), a, b, B.raw(),
            operand_desc(1, body, d.n, Trans::N, memory::data_type::f32), c);
  }
  if (tail > 0) {
    thread_local TailScratch<T> s;
    const size_t a_elems = static_cast<size_t>(kRowBlock * d.k),
                 c_elems = static_cast<size_t>(kRowBlock * d.n);
    if (s.a.size() < a_elems) s.a.assign(a_elems, T{});  // zero rows below the tail
    if (s.c.size() < c_elems) s.c.assign(c_elems, 0.0f);
    std::copy_n(a + body * d.k, tail * d.k, s.a.data());
    std::fill_n(s.a.data() + tail * d.k, (kRowBlock - tail) * d.k, T{});
    if (beta != 0.0f) std::copy_n(c + body * d.n, tail * d.n, s.c.data());
    Dims dp{1, 1, kRowBlock, d.n, d.k};
    Primitive prim = lookup(make_key(dp, Trans::N, tb, dtype, alpha, beta, threads));
    execute(prim, operand_desc(1, kRowBlock, d.k, Trans::N, dt), s.a.data(), b, B.raw(),
            operand_desc(1, kRowBlock, d.n, Trans::N, memory::data_type::f32), s.c.data());
    std::copy_n(s.c.data(), tail * d.n, c + body * d.n);
  }
}

// bf16 weight gradient dW += dyᵀ·x (ta = T, tb = N), tokens in K: the runtime-K jit GEMM ran at
// ~0.4× the AMX rate at ZAYA1's shapes, so K is rounded up to a multiple of kRowBlock by copying
// both operands into zero-padded scratch ([Kp, M] and [Kp, N]; each 2-D and row-major, the token
// rows contiguous) and run through the primitive for Kp (at most tokens / kRowBlock of them). The
// padding rows add exact zeros to every dot product. When K is already a multiple, no copy.
void run_k_padded(const Dims& d, const Tensor& A, const Tensor& B, const Tensor& C, float alpha, float beta,
                  int threads) {
  const int64_t kp = (d.k + kRowBlock - 1) / kRowBlock * kRowBlock;
  const bf16* a = A.data<bf16>();
  const bf16* b = B.data<bf16>();
  if (kp != d.k) {
    thread_local TailScratch<bf16> sa, sb;  // .a only
    const size_t a_elems = static_cast<size_t>(kp * d.m), b_elems = static_cast<size_t>(kp * d.n);
    if (sa.a.size() < a_elems) sa.a.resize(a_elems);
    if (sb.a.size() < b_elems) sb.a.resize(b_elems);
    std::copy_n(a, d.k * d.m, sa.a.data());
    std::fill_n(sa.a.data() + d.k * d.m, (kp - d.k) * d.m, bf16{});
    std::copy_n(b, d.k * d.n, sb.a.data());
    std::fill_n(sb.a.data() + d.k * d.n, (kp - d.k) * d.n, bf16{});
    a = sa.a.data();
    b = sb.a.data();
  }
  Dims dp{1, 1, d.m, d.n, kp};
  Primitive prim = lookup(make_key(dp, Trans::T, Trans::N, DType::bf16, alpha, beta, threads));
  auto dt = memory::data_type::bf16;
  execute(prim, operand_desc(1, d.m, kp, Trans::T, dt), a, operand_desc(1, kp, d.n, Trans::N, dt), b,
          operand_desc(1, d.m, d.n, Trans::N, memory::data_type::f32), C.raw());
}

// Runs through the runtime-dims primitive; false when oneDNN has no optimized one for the case.
bool run_runtime(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C,
                 float alpha, float beta, bool runtime_m, bool runtime_k, int threads) {
  Dims dk = d;
  if (runtime_m) dk.m = kRuntime;
  if (runtime_k) dk.k = kRuntime;
  Primitive prim = lookup(make_key(dk, ta, tb, A.dtype(), alpha, beta, threads));
  if (!prim) return false;
  auto dt = dnnl_type(static_cast<uint8_t>(A.dtype()));
  execute(prim, operand_desc_2d(d.m, d.k, ta, dt), A.raw(), operand_desc_2d(d.k, d.n, tb, dt), B.raw(),
          operand_desc_2d(d.m, d.n, Trans::N, memory::data_type::f32), C.raw());
  return true;
}

// Whether the problems of a grouped call run side by side, one whole GEMM per thread, instead of
// one after another with every thread on each: each expert's GEMM is small (the demo's ~230 tokens
// × 1024 × 256), and split over threads it pays a split and a barrier and both threads stream the
// same weights; on one thread its weights stay in that core's L2. bench_ops_gemm's split_ab A/B
// (demo forms, 8 experts, f32, 2 threads): 1.05–1.10× (docs/ops-gemm.md). Free threads take the
// problems largest first (by FLOPs); when even that plan leaves the busiest thread more than
// kMaxImbalance above the mean (few or very uneven experts), the call stays serial. Large expert
// weights (ZAYA1's, ≥ kLargeWeight elements) stay serial too: they fit no core's L2 either way, and
// side by side measured 0.92× (gate_up) to 1.03× (weight gradient) there; on 2 Zen 4 cores, f32
// 0.93–0.94× (gate_up, dx) and 1.03× (dW). The exception is bf16 x·Wᵀ and dy·W at a runtime M
// (oneDNN without AMX, bf16_fixed_shapes): ZAYA1's gate_up ran 1.03–1.18× side by side there
// (4 alternations of bench_ops_gemm gemm_grouped/zaya1 with a temporary switch), its
// dx 0.89–1.31× (median 1.06×).
//
// split_problems says more than whether the call itself runs side by side (`balanced`): whether
// the problems could run one per thread at all (`possible`: small weights, no overlapping C, two
// or more problems and threads), and whether there are no more problems than threads (`few`).
// The model's fused experts decide on those (gemm_grouped_side_by_side_plan).
constexpr double kMaxImbalance = 1.2;
std::atomic<bool> g_side_by_side{true};
SideBySidePlan split_problems(std::span<GemmProblem> problems, const std::vector<Dims>& dims,
                              const std::vector<size_t>& todo, Trans ta, int threads,
                              std::vector<size_t>& order) {
  SideBySidePlan plan;
  if (!g_side_by_side.load(std::memory_order_relaxed)) return plan;
  if (threads < 2 || todo.size() < 2 || omp_in_parallel()) return plan;
  // Problems that write overlapping C (several groups accumulating into one gradient, beta = 1)
  // must run in order, as a serial call runs them.
  std::vector<std::pair<const char*, const char*>> spans;
  for (size_t i : todo) {
    const auto* c = static_cast<const char*>(problems[i].C.raw());
    spans.emplace_back(c, c + problems[i].C.nbytes());
  }
  std::sort(spans.begin(), spans.end());
  for (size_t j = 1; j < spans.size(); ++j)
    if (spans[j].first < spans[j - 1].second) return plan;
  std::vector<double> work(todo.size());
  double total = 0;
  for (size_t j = 0; j < todo.size(); ++j) {
    const Dims& d = dims[todo[j]];
    const bool large = (ta == Trans::N ? d.n * d.k : d.m * d.n) >= kLargeWeight;
    const bool bf16_runtime_m =
        ta == Trans::N && problems[todo[j]].A.dtype() == DType::bf16 && !bf16_fixed_shapes();
    if (large && !bf16_runtime_m) return plan;  // see above
    work[j] = flops_of(d.batch, d.m, d.n, d.k);
    total += work[j];
  }
  order.resize(todo.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return work[a] > work[b]; });
  plan.possible = true;
  plan.few = todo.size() <= static_cast<size_t>(threads);
  if (todo.size() < static_cast<size_t>(threads)) return plan;
  // The plan the threads will roughly follow (each free thread takes the next largest): if even
  // that leaves one thread far busier than the mean, the call stays serial.
  std::vector<double> load(static_cast<size_t>(threads), 0.0);
  for (size_t j : order) *std::min_element(load.begin(), load.end()) += work[j];
  plan.balanced = *std::max_element(load.begin(), load.end()) <= kMaxImbalance * total / threads;
  return plan;
}

// Runs run_one(j) for j = 0..count−1 on `threads` threads, each taking the next j as it frees up
// (the caller orders them largest first): taken as threads free up rather than dealt out in
// advance, because equal FLOPs do not take equal times (a weight still in L2, the other core's
// GEMM sharing the memory bus), so the threads finish within about one problem of each other.
// begin()/end() run once per thread around its share (take_in_turn). Adds the call and the
// spread of the threads' finishing times to the GEMM time counters.
template <class Begin, class RunOne, class End>
void run_side_by_side(size_t count, int threads, Begin&& begin, RunOne&& run_one, End&& end) {
  std::atomic<int64_t> first_done{INT64_MAX}, last_done{0};  // ns after t0
  const auto t0 = std::chrono::steady_clock::now();
  auto finish = [&] {
    end();
    const int64_t done =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t f = first_done.load(); done < f && !first_done.compare_exchange_weak(f, done);) {
    }
    for (int64_t l = last_done.load(); done > l && !last_done.compare_exchange_weak(l, done);) {
    }
  };
  take_in_turn(count, threads, begin, run_one, finish);
  record_side_by_side(std::max<int64_t>(0, last_done.load() - first_done.load()));
}

// ----------------------------------------------------------------------------- AMX grouped path
// bf16 grouped GEMMs run on the hand-written AMX kernel (cpu/amx_gemm.h) when the CPU has it and
// the call fits: alpha = 1, beta 0 or 1, 2-D problems, N a multiple of 16 and, for ta = N, K a
// multiple of 32 (A's rows are read as tiles in place), and, for x·Wᵀ and dy·W, a small expert
// weight (N·K < 2^20: the demo's). There the token count is just a loop bound, where oneDNN 2.6
// needs a primitive per count or a runtime-M path without AMX: 1.0–1.5× oneDNN's rate on the
// demo's grouped GEMMs (the weight gradient gaining least). Large weights (ZAYA1's 4096 × 2048)
// stay on oneDNN for x·Wᵀ and dy·W: packing 8–16 MiB of weights per expert and call costs more
// than the kernel gains there (0.66–1.35× of oneDNN in A/B runs, with and without K chunking;
// docs/results/ops-cpu.md). Weight gradients dyᵀ·x (ta = T) take the kernel at every size: both
// operands are the expert's tokens (K = its token count, ~256 at ZAYA1's), so packing is cheap
// next to the product, and at ZAYA1's [2048 × 2048] dW it ran 1.22–1.28× oneDNN's zero-padded-K
// path (gemm_grouped_ab/zaya1/expert_down_dw). The path depends only on shapes and the CPU, so
// results stay deterministic.
std::atomic<bool> g_amx_enabled{true};

bool amx_fits(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  if (!g_amx_enabled.load(std::memory_order_relaxed) || alpha != 1.0f || (beta != 0.0f && beta != 1.0f))
    return false;
  if (ta == Trans::T && tb == Trans::T) return false;
  for (const GemmProblem& p : problems) {
    if (!p.A.defined() || !p.B.defined() || !p.C.defined()) return false;
    if (p.A.dtype() != DType::bf16 || p.A.ndim() != 2 || p.B.ndim() != 2) return false;
    int64_t m, k, kb, n;
    gemm_op_dims(p.A, ta, m, k);
    gemm_op_dims(p.B, tb, kb, n);
    if (n % 16 != 0 || (ta == Trans::N && k % 32 != 0)) return false;
    if (ta == Trans::N && n * k >= kLargeWeight) return false;
  }
  return cpu::amx_usable();
}

// This thread's scratch for packed operands (kept: the expert GEMMs call every layer).
std::vector<bf16>& amx_scratch() {
  thread_local std::vector<bf16> buf;
  return buf;
}

// One problem's slot of packed operands: B packed for [Kp, N] first, then (ta = T: A is [K, M],
// tokens × outputs) A transposed into [M, Kp]. lda is the row length amx_gemm reads A with.
struct AmxSlot {
  size_t b_elems, a_elems;
  int64_t lda;
};
AmxSlot amx_slot(const Dims& d, Trans ta) {
  const int64_t kp = (d.k + 31) / 32 * 32;
  if (d.m == 0) return {0, 0, 0};  // empty, or done by trivial()
  return {static_cast<size_t>(cpu::amx_packed_b_elems(d.k, d.n)),
          ta == Trans::T ? static_cast<size_t>(d.m * kp) : 0, ta == Trans::T ? kp : d.k};
}

// Packs problem p into its slot; then multiplies from it. `whole`: this thread does the whole
// problem (side by side), otherwise every thread of the region its share (amx_gemm.h).
void amx_pack(const GemmProblem& p, const Dims& d, const AmxSlot& s, Trans ta, Trans tb, bf16* slot,
              bool whole) {
  cpu::amx_pack_b(slot, p.B.data<bf16>(), p.B.size(1), d.k, d.n, tb == Trans::T, whole);
  if (ta == Trans::T) cpu::amx_transpose_a(slot + s.b_elems, p.A.data<bf16>(), d.m, d.k, d.m, whole);
}
void amx_multiply(const GemmProblem& p, const Dims& d, const AmxSlot& s, Trans ta, const bf16* slot,
                  bool accumulate, bool whole) {
  const bf16* A = ta == Trans::T ? slot + s.b_elems : p.A.data<bf16>();
  cpu::amx_gemm(p.C.data<float>(), d.n, A, s.lda, slot, d.m, d.n, s.lda, accumulate, whole);
}

// Problems are packed and multiplied in chunks: all packing of a chunk, one barrier, all products
// of the chunk (problems write disjoint C), one barrier. Fewer barriers matter (idle threads sleep
// under OMP_WAIT_POLICY=PASSIVE and take microseconds to wake), but a chunk's packed B must still
// be in L2 when its products read it: with all 8 demo experts in one chunk (4 MiB packed) a demo
// gate_up call took 2.33–2.42 ms against 1.78 ms with 1 MiB chunks (each thread's half, 512 KiB,
// stays in its own L2 next to A and C). Measured in bench_ops_gemm's grouped demo benchmarks
// (docs/results/ops-cpu.md). A problem larger than the cap is a chunk of its own.
constexpr size_t kAmxChunkBytes = size_t{1} << 20;

void run_grouped_amx(std::span<GemmProblem> problems, const std::vector<Dims>& dims, Trans ta, Trans tb,
                     bool accumulate) {
  const size_t n = problems.size();
  std::vector<AmxSlot> slots(n);
  for (size_t i = 0; i < n; ++i) slots[i] = amx_slot(dims[i], ta);
  const int threads = num_threads();
  std::vector<size_t> todo, order;
  for (size_t i = 0; i < n; ++i)
    if (dims[i].m > 0) todo.push_back(i);
  if (split_problems(problems, dims, todo, ta, threads, order).balanced) {
    // Side by side (as for oneDNN's path, see split_problems): each thread packs its problem into
    // its own scratch and multiplies right after, with no barrier in between; its packed B is
    // still in its L2. amx_gemm sums each C element in k order on one thread either way, so the
    // bits are those of the chunked path below.
    run_side_by_side(
        order.size(), threads, [] { cpu::amx_tile_begin(); },
        [&](size_t j) {
          const size_t i = todo[order[j]];
          std::vector<bf16>& buf = amx_scratch();
          if (buf.size() < slots[i].b_elems + slots[i].a_elems)
            buf.resize(slots[i].b_elems + slots[i].a_elems);
          amx_pack(problems[i], dims[i], slots[i], ta, tb, buf.data(), true);
          amx_multiply(problems[i], dims[i], slots[i], ta, buf.data(), accumulate, true);
        },
        [] { cpu::amx_tile_end(); });
    return;
  }
  // Per problem: offset of its slot in the (calling thread's) scratch, which the chunks reuse.
  std::vector<size_t> off(n), chunk_end;
  size_t used = 0, peak = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t need = slots[i].b_elems + slots[i].a_elems;
    if (used > 0 && (used + need) * sizeof(bf16) > kAmxChunkBytes) {
      chunk_end.push_back(i);
      used = 0;
    }
    off[i] = used;
    used += need;
    peak = std::max(peak, used);
  }
  chunk_end.push_back(n);
  std::vector<bf16>& scratch = amx_scratch();
  if (scratch.size() < peak) scratch.resize(peak);
  bf16* buf = scratch.data();
#pragma omp parallel num_threads(threads)
  {
    cpu::amx_tile_begin();
    size_t begin = 0;
    for (size_t end : chunk_end) {
      for (size_t i = begin; i < end; ++i)  // pack (no barriers between problems)
        if (dims[i].m > 0) amx_pack(problems[i], dims[i], slots[i], ta, tb, buf + off[i], false);
#pragma omp barrier
      for (size_t i = begin; i < end; ++i)  // multiply (problems write disjoint C)
        if (dims[i].m > 0) amx_multiply(problems[i], dims[i], slots[i], ta, buf + off[i], accumulate, false);
#pragma omp barrier  // the next chunk reuses the buffer
      begin = end;
    }
    cpu::amx_tile_end();
  }
}

// The fewest rows of a row piece of a product with the tokens in M (the side-by-side row halves,
// run_grouped_problem's row pieces): the one-thread runtime-M kernel gives such a piece the whole
// product's bits for its rows (an 11-row tail of 107 rows did not: tools/grouped_thread_bits_probe.cc
// pieces).
constexpr int64_t kMinHalfRows = 64;
void run_grouped_rows(const GemmProblem& p, const Dims& d, int64_t r0, int64_t rows, Trans ta, Trans tb,
                      float alpha, float beta);

// One problem of a grouped call (checked, non-trivial) through the oneDNN path that suits it (see
// the list above). `next_after`: problem i+1 is non-trivial and runs after this one on the same
// thread, so this one may write its rows past the end (may_run_past_end).
void run_grouped_problem(std::span<GemmProblem> problems, size_t i, const Dims& d, Trans ta, Trans tb,
                         float alpha, float beta, int threads, bool next_after) {
  GemmProblem& p = problems[i];
  if (d.batch != 1 || p.A.ndim() != 2 || p.B.ndim() != 2) {  // batched groups: per shape
    run_plain(d, p.A, ta, p.B, tb, p.C, alpha, beta, threads);
    return;
  }
  const bool is_bf16 = p.A.dtype() == DType::bf16;
  if (ta == Trans::N &&
      (is_bf16 ? d.n * d.k < kLargeWeight && bf16_fixed_shapes() : d.n * d.k >= kLargeWeight)) {
    const GemmProblem* next = next_after ? &problems[i + 1] : nullptr;
    const bool past_end_ok =
        may_run_past_end(d, p, next, (d.m + kRowBlock - 1) / kRowBlock * kRowBlock, beta);
    if (is_bf16)
      run_row_blocked<bf16>(d, p.A, p.B, tb, p.C, alpha, beta, past_end_ok, threads);
    else
      run_row_blocked<float>(d, p.A, p.B, tb, p.C, alpha, beta, past_end_ok, threads);
    return;
  }
  if (is_bf16 && ta == Trans::T && tb == Trans::N && d.m * d.n >= kLargeWeight && bf16_fixed_shapes()) {
    run_k_padded(d, p.A, p.B, p.C, alpha, beta, threads);
    return;
  }
  // Products with the tokens in M on several threads run as row pieces, each through the
  // one-thread runtime-M kernel (run_grouped_rows), taken by the threads in turn: all f32 ones
  // (their weights are small here), and bf16 ones of fewer than 2·kMinHalfRows rows, which then
  // run whole on one thread. oneDNN's own threading of that kernel gave other bits than one
  // thread: f32 x·Wᵀ with K ≥ 1024 at every M ≥ 16 (K × N 1024 × 128 to 1024 × 512, 2048 × 128
  // and × 256, 4096 × 128), and a one-row dy·W, f32 at every small weight tried with K ≥ 512 and
  // bf16 at large ones (tools/grouped_thread_bits_probe.cc on the 2-vCPU Intel VM, oneDNN 2.6.3).
  // A demo training run whose router sent
  // one token to an expert drifted from its one-thread twin that way. Pieces of at least
  // kMinHalfRows rows give the whole product's bits for their rows, as the side-by-side row
  // halves do. `Gemm.GroupedRowProductsAreThreadCountFree`.
  if (ta == Trans::N && (!is_bf16 || d.m < 2 * kMinHalfRows) && threads > 1 && !omp_in_parallel()) {
    const int64_t count = std::clamp<int64_t>(d.m / kMinHalfRows, 1, 2 * static_cast<int64_t>(threads));
    const int64_t step = row_piece_step(d.m, count);
    run_pieces_in_turn(static_cast<size_t>(count), threads, [&](size_t j) {
      const int64_t r0 = static_cast<int64_t>(j) * step;
      run_grouped_rows(p, d, r0, j + 1 < static_cast<size_t>(count) ? step : d.m - r0, ta, tb, alpha, beta);
    });
    return;
  }
  if (!run_runtime(d, p.A, ta, p.B, tb, p.C, alpha, beta, ta == Trans::N, ta == Trans::T, threads))
    run_fixed(d, p.A, ta, p.B, tb, p.C, alpha, beta, threads);
}

// Rows [r0, r0 + rows) of a 2-D grouped problem with tokens in M (x·Wᵀ, dy·W), on one thread
// through run_grouped_problem's paths: the token count stays a runtime dim, and each row's result
// is the whole problem's.
void run_grouped_rows(const GemmProblem& p, const Dims& d, int64_t r0, int64_t rows, Trans ta, Trans tb,
                      float alpha, float beta) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.A.dtype()));
  GemmProblem piece{Tensor::borrow(static_cast<char*>(p.A.raw()) + r0 * d.k * es, {rows, d.k}, p.A.dtype()),
                    p.B, Tensor::borrow(p.C.data<float>() + r0 * d.n, {rows, d.n}, DType::f32)};
  Dims pd = d;
  pd.m = rows;
  run_grouped_problem(std::span<GemmProblem>(&piece, 1), 0, pd, ta, tb, alpha, beta, 1, false);
}

// One grouped problem where oneDNN's results depend on the thread count (threads_change_bits):
// x·Wᵀ and dy·W (tokens in M) as row pieces (pieces_of, fixed by the shape), each through
// run_grouped_problem's paths on one thread, so the token count stays a runtime dim; weight
// gradients (tokens in K) and batched groups through run_pieces. Same bits on any thread count,
// and whether the call ran side by side (threads = 1 here) or not.
void run_grouped_pieces(const GemmProblem& p, const Dims& d, Trans ta, Trans tb, float alpha, float beta,
                        int threads) {
  if (ta == Trans::T || d.batch != 1 || p.A.ndim() != 2 || p.B.ndim() != 2) {
    run_pieces(d, p.A, ta, p.B, tb, p.C, alpha, beta, threads);
    return;
  }
  const int64_t es = static_cast<int64_t>(dtype_size(p.A.dtype()));
  if (tb == Trans::T && p.A.dtype() == DType::f32 && d.n * d.k >= kLargeWeight && d.n > d.m) {
    // x·Wᵀ with a large weight (ZAYA1's experts: 4096 × 2048): pieces along N, W's rows, so the
    // weight is streamed once in all and the token count stays a runtime dim.
    const Pieces pc = pieces_of(d);
    const auto dt = memory::data_type::f32;
    auto run_one = [&](size_t j) {
      const int64_t j0 = static_cast<int64_t>(j) * pc.step, cols = std::min(pc.step, d.n - j0);
      Dims pd{1, 1, kRuntime, cols, d.k};
      Key key = make_key(pd, Trans::N, Trans::T, DType::f32, alpha, beta, 1);
      key.ldb = d.k;
      key.ldc = d.n;
      Primitive prim = lookup(key);
      if (!prim) {
        key.m = d.m;
        key.lda = d.k;
        prim = lookup(key);
      }
      execute(prim, block_desc(d.m, d.k, Trans::N, d.k, dt), p.A.data<float>(),
              block_desc(d.k, cols, Trans::T, d.k, dt), p.B.data<float>() + j0 * d.k,
              block_desc(d.m, cols, Trans::N, d.n, memory::data_type::f32), p.C.data<float>() + j0);
    };
    run_pieces_in_turn(static_cast<size_t>(pc.count), threads, run_one);
    return;
  }
  const Pieces pc = pieces_of(d, /*m_only=*/true);
  if (tb == Trans::N && p.A.dtype() == DType::f32 && pads_operand(Trans::N, Trans::N, false, d.n) &&
      1.0 / static_cast<double>(pc.step) + 1.0 / static_cast<double>(d.n) >= kForceNoCopy) {
    // dy·W on the no-copy kernels with W's rows a multiple of 512 bytes apart (pads_operand; the
    // demo's down projection: 2 KiB, ZAYA1's experts: 8 KiB):
    // W copied once, here, to a padded stride that every piece reads; the token count stays a
    // runtime dim (a fixed-shape primitive per row count only where oneDNN has no runtime one).
    const char* w = nullptr;
    const int64_t pld = copy_padded(static_cast<const char*>(p.B.raw()), d.k, d.n, d.n, es, 1, &w);
    const auto dt = memory::data_type::f32;
    auto run_one = [&](size_t j) {
      const int64_t i0 = static_cast<int64_t>(j) * pc.step, rows = std::min(pc.step, d.m - i0);
      Dims pd{1, 1, kRuntime, d.n, d.k};
      Key key = make_key(pd, Trans::N, Trans::N, DType::f32, alpha, beta, 1);
      key.ldb = pld;
      Primitive prim = lookup(key);
      if (!prim) {  // a fixed shape: every operand a 2-D strided block, as run_pieces builds them
        key.m = rows;
        key.lda = d.k;
        key.ldc = d.n;
        prim = lookup(key);
      }
      execute(prim, block_desc(rows, d.k, Trans::N, d.k, dt), p.A.data<float>() + i0 * d.k,
              block_desc(d.k, d.n, Trans::N, pld, dt), w,
              block_desc(rows, d.n, Trans::N, d.n, memory::data_type::f32), p.C.data<float>() + i0 * d.n);
    };
    run_pieces_in_turn(static_cast<size_t>(pc.count), threads, run_one);
    return;
  }
  auto run_one = [&](size_t j) {
    const int64_t i0 = static_cast<int64_t>(j) * pc.step;
    run_grouped_rows(p, d, i0, std::min(pc.step, d.m - i0), ta, tb, alpha, beta);
  };
  const auto count = static_cast<size_t>(pc.count);
  run_pieces_in_turn(count, threads, run_one);
}

// The work items of a side-by-side grouped call, largest first: whole problems, except that f32
// x·Wᵀ and dy·W problems (tokens in M) of at least 2·kMinHalfRows rows go as two row halves
// (their weights are small: split_problems keeps large f32 weights out of side-by-side calls).
// Threads take the items as they free up, so the one that finishes first then waits for at most
// about one item: halving the items halves that wait (the demo's 24 grouped calls per step had the
// two threads finish 0.14–0.26 ms apart with whole experts). A half is the whole problem's rows
// computed on one thread by the same runtime-M kernel (the bits do not depend on the cut:
// Gemm.GroupedExpertsSideBySideMatchReferenceAndOneThreadBitwise).
struct GroupedItem {
  size_t i;          // the problem
  int64_t r0, rows;  // its rows [r0, r0 + rows)
  double work;
};
std::vector<GroupedItem> grouped_items(std::span<GemmProblem> problems, const std::vector<Dims>& dims,
                                       const std::vector<size_t>& todo, const std::vector<size_t>& order,
                                       Trans ta) {
  std::vector<GroupedItem> items;
  for (size_t j : order) {
    const size_t i = todo[j];
    const Dims& d = dims[i];
    const GemmProblem& p = problems[i];
    const bool halve = ta == Trans::N && d.batch == 1 && p.A.dtype() == DType::f32 && p.A.ndim() == 2 &&
                       p.B.ndim() == 2 && d.m >= 2 * kMinHalfRows;
    if (!halve) {
      items.push_back({i, 0, d.m, flops_of(d.batch, d.m, d.n, d.k)});
      continue;
    }
    const int64_t half = (d.m / 2 + 7) / 8 * 8;
    items.push_back({i, 0, half, flops_of(1, half, d.n, d.k)});
    items.push_back({i, half, d.m - half, flops_of(1, d.m - half, d.n, d.k)});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const GroupedItem& a, const GroupedItem& b) { return a.work > b.work; });
  return items;
}

// A grouped call with bf16 operands on a CPU without a bf16 matmul: every problem widened to f32
// into one buffer of this thread's (kept from call to call).
std::vector<GemmProblem> widen_problems(std::span<GemmProblem> problems) {
  thread_local std::vector<float> wide;
  size_t total = 0;
  for (const GemmProblem& p : problems) total += static_cast<size_t>(p.A.numel() + p.B.numel());
  if (wide.size() < total) wide.resize(total);
  std::vector<GemmProblem> out;
  out.reserve(problems.size());
  float* at = wide.data();
  auto widen = [&](const Tensor& x) {
    Tensor w = widen_into(x, at);
    at += x.numel();
    return w;
  };
  for (const GemmProblem& p : problems) {
    Tensor a = widen(p.A);
    out.push_back({a, widen(p.B), p.C});
  }
  return out;
}

// The checks of ops::gemm_grouped for one problem of a CPU-only entry point, which reads the
// operands on the host.
Dims check_cpu_problem(std::string_view op, const GemmProblem& p, Trans ta, Trans tb) {
  const OpDevice on(op, {{"A", p.A}, {"B", p.B}, {"C", p.C}});
  const Dims d = check_gemm_problem(op, p.A, ta, p.B, tb, p.C);
  if (!on.cpu()) on.no_kernel();
  return d;
}

}  // namespace

void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  // Groups run one after another so each GEMM gets every thread and the order of work is fixed.
  // Which dims vary from group to group (and step to step) is read off the problems: the token
  // count is M for ta = N (x·Wᵀ, dy·W) and K for ta = T (dyᵀ·x); N (and K for ta = N) are the
  // expert weight's, shared by all groups.
  if (!bf16_matmul_native() && std::any_of(problems.begin(), problems.end(), [](const GemmProblem& p) {
        return p.A.defined() && p.B.defined() && (p.A.dtype() == DType::bf16 || p.B.dtype() == DType::bf16);
      })) {
    std::vector<GemmProblem> wide = widen_problems(problems);
    cpu::gemm_grouped(wide, ta, tb, alpha, beta);
    return;
  }
  TimedCall timed;
  if (amx_fits(problems, ta, tb, alpha, beta)) {
    std::vector<Dims> dims;
    dims.reserve(problems.size());
    for (GemmProblem& p : problems) {
      Dims d = gemm_dims(p.A, ta, p.B, tb);
      if (trivial(d, p.C, beta)) d.m = 0;  // nothing left for the kernel
      timed.add_flops(flops_of(d.batch, d.m, d.n, d.k));
      if (timed.wants_label())
        timed.set_label(shape_label(true, ta, tb, 1, ta == Trans::N ? -1 : d.m, d.n,
                                    ta == Trans::T ? -1 : d.k, p.A.dtype()));
      dims.push_back(d);
    }
    run_grouped_amx(problems, dims, ta, tb, beta != 0.0f);
    return;
  }
  std::vector<Dims> dims(problems.size());
  std::vector<size_t> todo;  // the non-trivial problems, in order
  for (size_t i = 0; i < problems.size(); ++i) {
    GemmProblem& p = problems[i];
    Dims& d = dims[i];
    d = gemm_dims(p.A, ta, p.B, tb);
    if (trivial(d, p.C, beta)) continue;
    timed.add_flops(flops_of(d.batch, d.m, d.n, d.k));
    if (timed.wants_label())  // the token dim is M for ta = N and K for ta = T
      timed.set_label(shape_label(true, ta, tb, 1, ta == Trans::N ? -1 : d.m, d.n, ta == Trans::T ? -1 : d.k,
                                  p.A.dtype()));
    todo.push_back(i);
  }
  const int threads = num_threads();
  std::vector<size_t> order;
  if (split_problems(problems, dims, todo, ta, threads, order).balanced) {
    // Each problem (or row half: grouped_items) whole on one thread: a primitive built for 1
    // thread, the same bits as with ZAYA_THREADS=1 whichever thread runs it. No problem may run
    // past its end here (which thread runs the next one is not known).
    if (threads_change_bits()) {
      run_side_by_side(
          order.size(), threads, [] {},
          [&](size_t j) {
            run_grouped_pieces(problems[todo[order[j]]], dims[todo[order[j]]], ta, tb, alpha, beta, 1);
          },
          [] {});
      return;
    }
    const std::vector<GroupedItem> items = grouped_items(problems, dims, todo, order, ta);
    run_side_by_side(
        items.size(), threads, [] {},
        [&](size_t j) {
          const GroupedItem& it = items[j];
          if (it.rows == dims[it.i].m)
            run_grouped_problem(problems, it.i, dims[it.i], ta, tb, alpha, beta, 1, false);
          else
            run_grouped_rows(problems[it.i], dims[it.i], it.r0, it.rows, ta, tb, alpha, beta);
        },
        [] {});
    return;
  }
  if (threads_change_bits()) {
    for (size_t i : todo) run_grouped_pieces(problems[i], dims[i], ta, tb, alpha, beta, threads);
    return;
  }
  for (size_t j = 0; j < todo.size(); ++j)
    run_grouped_problem(problems, todo[j], dims[todo[j]], ta, tb, alpha, beta, threads,
                        j + 1 < todo.size() && todo[j + 1] == todo[j] + 1);
}

SideBySidePlan gemm_grouped_side_by_side_plan(std::span<GemmProblem> problems, Trans ta, Trans tb,
                                              std::vector<size_t>& order) {
  constexpr std::string_view op = "gemm_grouped_side_by_side_plan";
  std::vector<Dims> dims(problems.size());
  std::vector<size_t> todo, planned;
  for (size_t i = 0; i < problems.size(); ++i) {
    const Dims& d = dims[i] = check_cpu_problem(op, problems[i], ta, tb);
    if (d.batch > 0 && d.m > 0 && d.n > 0 && d.k > 0)
      todo.push_back(i);  // trivial()'s test, without its writes
  }
  const SideBySidePlan plan = split_problems(problems, dims, todo, ta, num_threads(), planned);
  order.clear();
  if (plan.possible)
    for (size_t j : planned) order.push_back(todo[j]);
  return plan;
}

void gemm_grouped_on_this_thread(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha,
                                 float beta) {
  for (size_t i = 0; i < problems.size(); ++i) {
    GemmProblem& p = problems[i];
    const Dims d = check_cpu_problem("gemm_grouped_on_this_thread", p, ta, tb);
    ZAYA_CHECK(p.A.dtype() == DType::f32,
               "gemm_grouped_on_this_thread: f32 operands only (bf16 grouped calls go through gemm_grouped)");
    if (trivial(d, p.C, beta)) continue;
    if (threads_change_bits())
      run_grouped_pieces(p, d, ta, tb, alpha, beta, 1);
    else
      run_grouped_problem(problems, i, d, ta, tb, alpha, beta, 1, false);
  }
}

void gemm_use_amx(bool on) { g_amx_enabled = on; }

void gemm_grouped_side_by_side(bool on) { g_side_by_side = on; }

void gemm_force_bf16_fixed_shapes(bool on) { g_force_bf16_fixed_shapes = on; }

}  // namespace zaya::ops::cpu
