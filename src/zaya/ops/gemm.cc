// GEMM through oneDNN matmul (see gemm.h). oneDNN describes a transposed operand with strides
// instead of a copy, so all four transpose combinations run without moving data.
#include "zaya/ops/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "zaya/core/parallel.h"
#include "zaya/core/threads.h"
#include "zaya/ops/cpu/amx_gemm.h"
#include "zaya/ops/cpu/op_checks.h"

namespace zaya::ops {
namespace {

using dnnl::memory;

// Everything that changes the primitive oneDNN builds. The thread count is part of it because
// oneDNN fixes its work partition (and so the reduction order) when the primitive is created.
// m or k may be kRuntime: a primitive for every value of that dim, given at execution (the
// grouped expert GEMMs, whose token counts change every step; see gemm_grouped).
constexpr int64_t kRuntime = -1;
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

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(k.batch_a);
    mix(k.batch_b);
    mix(k.m);
    mix(k.n);
    mix(k.k);
    mix(k.ta | (k.tb << 8) | (k.dtype << 16));
    mix(k.alpha_bits);
    mix(k.beta_bits);
    mix(static_cast<uint64_t>(k.threads));
    mix(static_cast<uint64_t>(k.lda));
    mix(static_cast<uint64_t>(k.ldb));
    mix(static_cast<uint64_t>(k.ldc));
    return h;
  }
};

// A bounded LRU: expert GEMMs see a new M almost every step, and an unbounded cache would grow
// with every token count ever seen. 512 entries hold a whole model's fixed shapes with room.
constexpr size_t kCacheCapacity = 512;

// Time spent inside gemm()/gemm_grouped() and the FLOPs they ran: the GEMM share of a step, so
// a benchmark can print how far the rest of the step is from the GEMM floor. Two clock reads per
// call (99 calls per demo step) cost nothing measurable. Relaxed atomics: totals only.
struct TimeCounters {
  std::atomic<int64_t> calls{0}, nanoseconds{0}, side_by_side_calls{0}, side_by_side_gap_ns{0};
  std::atomic<double> flops{0.0};
  std::atomic<bool> per_shape{false};
  std::mutex mu;  // guards shapes
  std::unordered_map<std::string, GemmShapeTime> shapes;
};
TimeCounters& time_counters() {
  static TimeCounters t;
  return t;
}

std::string shape_label(bool grouped, Trans ta, Trans tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                        DType dt) {
  std::string s = grouped ? "grouped " : "";
  s += ta == Trans::N ? 'N' : 'T';
  s += tb == Trans::N ? 'N' : 'T';
  s += batch > 1 ? " [" + std::to_string(batch) + "]" : "";
  auto dim = [](int64_t v) { return v < 0 ? std::string("?") : std::to_string(v); };
  return s + " " + dim(m) + "x" + dim(n) + "x" + dim(k) + (dt == DType::bf16 ? " bf16" : " f32");
}

// Adds one call's wall time and FLOPs to the counters, and to its shape's row when `label` is not
// empty.
void record_call(int64_t ns, double flops, const std::string& label) {
  TimeCounters& t = time_counters();
  t.calls.fetch_add(1, std::memory_order_relaxed);
  t.nanoseconds.fetch_add(ns, std::memory_order_relaxed);
  double cur = t.flops.load(std::memory_order_relaxed);
  while (!t.flops.compare_exchange_weak(cur, cur + flops, std::memory_order_relaxed)) {
  }
  if (!label.empty()) {
    std::lock_guard<std::mutex> lock(t.mu);
    GemmShapeTime& row = t.shapes[label];
    row.shape = label;
    row.calls += 1;
    row.seconds += static_cast<double>(ns) * 1e-9;
    row.flops += flops;
  }
}

// Adds one call's wall time and FLOPs on scope exit (and to its shape's row when profiling;
// the label is only built then).
class TimedCall {
 public:
  TimedCall() : t0_(std::chrono::steady_clock::now()) {}
  void add_flops(double f) { flops_ += f; }
  bool wants_label() const { return time_counters().per_shape.load(std::memory_order_relaxed); }
  void set_label(std::string s) { label_ = std::move(s); }
  ~TimedCall() {
    record_call(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(),
        flops_, label_);
  }

 private:
  std::chrono::steady_clock::time_point t0_;
  double flops_ = 0.0;
  std::string label_;
};

double flops_of(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

// A built matmul and the scratchpad bytes it needs. Every primitive takes its scratchpad from the
// caller (scratchpad_mode::user): oneDNN's own, in the default library mode, is one buffer shared
// by all primitives, which two threads running GEMMs side by side (gemm_grouped) would corrupt.
struct Primitive {
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
  explicit operator bool() const { return static_cast<bool>(prim); }
};

struct Cache {
  std::mutex mu;
  std::list<std::pair<Key, Primitive>> lru;  // front = most recently used
  std::unordered_map<Key, std::list<std::pair<Key, Primitive>>::iterator, KeyHash> index;
  int64_t hits = 0, misses = 0;
};

Cache& cache() {
  static Cache c;
  return c;
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// op(X) of shape [rows, cols] for a row-major X, possibly batched: strides say where element
// (b, i, j) lives, so Trans::T is a stride swap rather than a copy.
memory::desc operand_desc(int64_t batch, int64_t rows, int64_t cols, Trans t, memory::data_type dt) {
  int64_t batch_stride = rows * cols;
  if (t == Trans::N) return memory::desc({batch, rows, cols}, dt, {batch_stride, cols, 1});
  return memory::desc({batch, rows, cols}, dt, {batch_stride, 1, rows});
}

// The same for one 2-D operand whose dims may be kRuntime (then its strides are too). With real
// dims it describes the memory handed to a runtime-dims primitive at execution.
memory::desc operand_desc_2d(int64_t rows, int64_t cols, Trans t, memory::data_type dt) {
  auto d = [](int64_t v) { return v == kRuntime ? DNNL_RUNTIME_DIM_VAL : v; };
  if (t == Trans::N) return memory::desc({d(rows), d(cols)}, dt, {d(cols), 1});
  return memory::desc({d(rows), d(cols)}, dt, {1, d(rows)});
}

// op(X) of shape [rows, cols] for a 2-D block whose rows lie `ld` elements apart in X (a block of
// a larger row-major matrix); ld = 0 means dense (operand_desc). 2-D, not a batch of one: oneDNN
// 2.6's AVX2 gemm:jit ran a one-thread [1, 256, 1024] × [1, 1024, 1024] at 33 GFLOP/s against 84
// for the same product described in 2-D (Zen 3, ONEDNN_VERBOSE times).
memory::desc block_desc(int64_t rows, int64_t cols, Trans t, int64_t ld, memory::data_type dt) {
  if (ld == 0) return operand_desc(1, rows, cols, t, dt);
  auto d = [](int64_t v) { return v == kRuntime ? DNNL_RUNTIME_DIM_VAL : v; };
  if (t == Trans::N) return memory::desc({d(rows), d(cols)}, dt, {ld, 1});
  return memory::desc({d(rows), d(cols)}, dt, {1, ld});
}

bool has_runtime_dims(const Key& k) { return k.m == kRuntime || k.k == kRuntime; }

memory::data_type dnnl_type(uint8_t dtype) {
  return dtype == static_cast<uint8_t>(DType::bf16) ? memory::data_type::bf16 : memory::data_type::f32;
}

// Builds the primitive for k. For runtime dims it returns an empty handle when oneDNN would only
// offer a reference (unoptimized) implementation; the caller then builds per shape instead.
Primitive build(const Key& k) {
  auto dt = dnnl_type(k.dtype);
  const bool runtime = has_runtime_dims(k);
  const bool block = k.lda != 0 || k.ldb != 0 || k.ldc != 0;  // a piece of run_pieces (2-D, strided)
  auto desc = [&](int64_t batch, int64_t rows, int64_t cols, Trans t, int64_t ld, memory::data_type type) {
    if (runtime) return ld != 0 ? block_desc(rows, cols, t, ld, type) : operand_desc_2d(rows, cols, t, type);
    return block ? block_desc(rows, cols, t, ld, type) : operand_desc(batch, rows, cols, t, type);
  };
  memory::desc a = desc(k.batch_a, k.m, k.k, static_cast<Trans>(k.ta), k.lda, dt);
  memory::desc b = desc(k.batch_b, k.k, k.n, static_cast<Trans>(k.tb), k.ldb, dt);
  memory::desc c = desc(k.batch_a, k.m, k.n, Trans::N, k.ldc, memory::data_type::f32);
  float alpha, beta;
  std::memcpy(&alpha, &k.alpha_bits, 4);
  std::memcpy(&beta, &k.beta_bits, 4);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);  // dst = alpha·A·B + beta·dst
    attr.set_post_ops(po);
  }
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  if (runtime && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return {};
  return {dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
}

Primitive lookup(const Key& k) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.index.find(k); it != c.index.end()) {
    ++c.hits;
    c.lru.splice(c.lru.begin(), c.lru, it->second);
    return it->second->second;
  }
  ++c.misses;
  c.lru.emplace_front(k, build(k));
  c.index[k] = c.lru.begin();
  if (c.lru.size() > kCacheCapacity) {
    c.index.erase(c.lru.back().first);
    c.lru.pop_back();
  }
  return c.lru.front().second;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Rows and columns of op(X) for a 2-D or 3-D X.
void op_dims(const Tensor& x, Trans t, int64_t& rows, int64_t& cols) {
  int64_t r = x.size(-2), c = x.size(-1);
  rows = t == Trans::N ? r : c;
  cols = t == Trans::N ? c : r;
}

bool overlaps(const Tensor& x, const Tensor& y) {
  auto* x0 = static_cast<const char*>(x.raw());
  auto* y0 = static_cast<const char*>(y.raw());
  return x.nbytes() > 0 && y.nbytes() > 0 && x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

// The checked dims of one C = op(A)·op(B) problem.
struct Dims {
  int64_t batch, batch_b, m, n, k;
};

Dims check_problem(const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C) {
  constexpr const char* op = "gemm";
  for (const Tensor* t : {&A, &B, &C}) {
    ZAYA_CHECK(t->defined(), op, ": undefined operand");
    detail::require_cpu(op, *t);
  }
  ZAYA_CHECK(A.dtype() == B.dtype() && (A.dtype() == DType::f32 || A.dtype() == DType::bf16), op,
             ": A and B must both be f32 or both bf16, found ", A.str(), " and ", B.str());
  ZAYA_CHECK(C.dtype() == DType::f32, op, ": C must be f32, found ", C.str());
  ZAYA_CHECK(A.ndim() == 2 || A.ndim() == 3, op, ": A must be 2-D or batched 3-D, found ", A.str());
  ZAYA_CHECK(C.ndim() == A.ndim(), op, ": C ", C.str(), " must have as many dims as A ", A.str());
  ZAYA_CHECK(B.ndim() == 2 || B.ndim() == A.ndim(), op, ": B ", B.str(), " must be 2-D or match A ", A.str());
  Dims d;
  d.batch = A.ndim() == 3 ? A.size(0) : 1;
  d.batch_b = B.ndim() == 3 ? B.size(0) : 1;
  ZAYA_CHECK(d.batch_b == d.batch || B.ndim() == 2, op, ": batch of B ", B.str(), " differs from A ",
             A.str());
  int64_t kb;
  op_dims(A, ta, d.m, d.k);
  op_dims(B, tb, kb, d.n);
  ZAYA_CHECK(d.k == kb, op, ": inner dims differ: op(A) is [", d.m, ", ", d.k, "] from A ", A.str(),
             ", op(B) is [", kb, ", ", d.n, "] from B ", B.str());
  Shape expect = A.ndim() == 3 ? Shape{d.batch, d.m, d.n} : Shape{d.m, d.n};
  check_shape("gemm: C", C, expect);
  ZAYA_CHECK(!overlaps(C, A) && !overlaps(C, B), op, ": C must not overlap A or B");
  return d;
}

// Handles the empty cases; returns true when there is nothing left for oneDNN to do.
bool trivial(const Dims& d, const Tensor& C, float beta) {
  if (d.m == 0 || d.n == 0 || d.batch == 0) return true;
  if (d.k == 0) {  // an empty sum: C = beta·C (and exactly 0 for beta = 0, even over NaN garbage)
    float* c = C.data<float>();
    for (int64_t i = 0; i < C.numel(); ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return true;
  }
  return false;
}

// `threads`: the thread count the primitive is built for and runs with (part of the key: oneDNN
// may block a GEMM differently for another count, and results must not depend on it).
Key make_key(const Dims& d, Trans ta, Trans tb, DType dt, float alpha, float beta, int threads) {
  return Key{d.batch,
             d.batch_b,
             d.m,
             d.n,
             d.k,
             static_cast<uint8_t>(ta),
             static_cast<uint8_t>(tb),
             static_cast<uint8_t>(dt),
             bits_of(alpha),
             bits_of(beta),
             threads};
}

void execute(const Primitive& p, const memory::desc& a, const void* ap, const memory::desc& b, const void* bp,
             const memory::desc& c, void* cp) {
  memory am(a, engine(), const_cast<void*>(ap));
  memory bm(b, engine(), const_cast<void*>(bp));
  memory cm(c, engine(), cp);
  // This thread's scratchpad, kept from call to call (grows to the largest need seen).
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < p.scratch_bytes + 64) scratch.resize(p.scratch_bytes + 64);
  void* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  memory sm({{static_cast<memory::dim>(p.scratch_bytes)}, memory::data_type::u8, {1}}, engine(), aligned);
  thread_local dnnl::stream stream(engine());
  p.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  stream.wait();
}

// A checked, non-trivial problem through the primitive built for exactly its shape.
void run_fixed(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C,
               float alpha, float beta, int threads) {
  Primitive prim = lookup(make_key(d, ta, tb, A.dtype(), alpha, beta, threads));
  auto dt = dnnl_type(static_cast<uint8_t>(A.dtype()));
  execute(prim, operand_desc(d.batch, d.m, d.k, ta, dt), A.raw(), operand_desc(d.batch_b, d.k, d.n, tb, dt),
          B.raw(), operand_desc(d.batch, d.m, d.n, Trans::N, memory::data_type::f32), C.raw());
}

// ------------------------------------------------------------- CPUs without AVX-512 (AVX2 only)
// Two things oneDNN 2.6 gives on the avx512_core CPUs these paths were tuned on do not hold on
// AVX2-only ones (AMD Zen 2/3, Intel before Skylake-SP; docs/ops-gemm.md, "AVX2 CPUs"):
//  * bf16 matmul: there is none below avx512_core (primitive creation fails). bf16 operands are
//    widened to f32 (exact) and run as f32: the same products, f32 accumulation, as the contract
//    in gemm.h says, at the f32 rate plus the copy.
//  * f32 results independent of the thread count: its AVX2 sgemm picks the blocking, and for
//    some shapes the kernel, per thread from the thread count, so 1 and 2 threads give different
//    bits (64×48×33 and 2048×64×256 among others, on a Zen 3 EPYC). There every GEMM runs as
//    pieces fixed by its shape alone (run_pieces), each on one thread through a primitive built
//    for one thread; the thread count only decides who runs which piece.
std::atomic<bool> g_force_avx2_paths{false};

bool bf16_matmul_native() {
  if (g_force_avx2_paths.load(std::memory_order_relaxed)) return false;
  static const bool native = [] {
    try {
      memory::desc a({16, 32}, memory::data_type::bf16, {32, 1}), b({32, 16}, memory::data_type::bf16, {16, 1});
      memory::desc c({16, 16}, memory::data_type::f32, {16, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine());
      return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

// Whether the ISA oneDNN runs on includes `want` (its cpu_isa values are bit sets).
bool onednn_isa_includes(dnnl::cpu_isa want) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto w = static_cast<unsigned>(want);
  return (isa & w) == w;
}

bool threads_change_bits() {
  if (g_force_avx2_paths.load(std::memory_order_relaxed)) return true;
  static const bool change = !onednn_isa_includes(dnnl::cpu_isa::avx512_core);
  return change;
}

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

// The pieces of one 2-D problem: its larger output dim (M, or N when N > M) cut into `count`
// spans of `step` (the last one shorter), fixed by the shape alone. At most kMaxPieces (a power
// of two, so 2 or 4 threads share them evenly); a piece keeps at least kMinPieceDim rows or
// columns and kMinPieceFlops. Every piece re-packs the operand it does not cut (oneDNN's own
// threads each pack theirs too), so more pieces than threads cost copies: 4 keeps that to one
// extra pack per thread on 2 threads.
//
// oneDNN 2.6's AVX2 sgemm runs a product on its "no-copy" kernels, which read the operands in
// place, whenever 1/m + 1/n >= 0.0038 (its driver's threshold, kForceNoCopy here). Those ran a
// 256×1024×1024 piece of 64-byte-aligned operands with 4 KiB rows at 34–40 GFLOP/s on one Zen 3
// core, where the packing kernels run the 512-row piece at 77. So while the whole problem is on
// the packing side of that line, only the first cut (two threads busy beats one) may cross it.
constexpr int64_t kMaxPieces = 4, kMinPieceDim = 16;
constexpr double kMinPieceFlops = 4e6, kForceNoCopy = 0.0038;
struct Pieces {
  bool along_m;
  int64_t step, count;
};
Pieces pieces_of(const Dims& d, bool m_only = false) {
  const bool along_m = m_only || d.m >= d.n;
  const int64_t dim = along_m ? d.m : d.n, other = along_m ? d.n : d.m;
  const double flops = flops_of(1, d.m, d.n, d.k);
  auto step_for = [&](int64_t count) { return ((dim + count - 1) / count + 7) / 8 * 8; };
  auto packs = [&](int64_t span) { return 1.0 / static_cast<double>(span) + 1.0 / static_cast<double>(other) < kForceNoCopy; };
  const bool whole_packs = packs(dim);
  int64_t count = 1;
  while (count < kMaxPieces && dim / (2 * count) >= kMinPieceDim && flops / static_cast<double>(2 * count) >= kMinPieceFlops &&
         (count == 1 || !whole_packs || packs(step_for(2 * count))))
    count *= 2;
  const int64_t step = step_for(count);
  return {along_m, step, (dim + step - 1) / step};
}

// oneDNN 2.6's AVX2 no-copy sgemm reads its operands in place, and with rows a multiple of 512
// bytes apart (every power-of-two width from 128 floats) they share a few L1 sets
// (tools/onednn_piece_probe.cc, one Zen 3 core, 2026-11-25):
//  * Aᵀ·B (the weight gradients dYᵀ·X), both operands: an 8192×256×2048 product ran at 30–43
//    GFLOP/s, at 92–94 with both operands' rows 64 bytes further apart; 256×256×2048: 70 → 93.
//  * A·B, B's rows: 256×512×256 ran at 62–67 GFLOP/s with B's rows 2 KiB apart and 94–98 padded,
//    256×2048×2048 at 43 → 93, and by 5–20% at 512 B–3 KiB strides (512×256×8192: 85 → 94).
//  * A·Bᵀ gained nothing (256×4096×2048: 74–75 either way).
// So such operands of pieces on the no-copy kernels are read from a copy with a padded stride:
// the operand every piece reads whole (B when the cut is along M, A along N) once per call, the
// other one per piece (a copy of K·(m + n) floats in all against K·m·n multiply-adds; pieces on
// the packing kernels pack their operands anyway).
constexpr int64_t kAliasedLd = 128;  // floats: 512 bytes

// Whether op(X) (X = A when is_a) of a no-copy product with these transposes is read from a padded
// copy when its row stride is ld (see above).
bool pads_operand(Trans ta, Trans tb, bool is_a, int64_t ld) {
  if (ld % kAliasedLd != 0) return false;
  if (ta == Trans::T) return true;
  return !is_a && tb == Trans::N;
}

// The block rows × cols at src (row stride ld elements of es bytes) copied with a padded row
// stride, which is returned; *dst points at the copy. Slots 0 and 1 are this thread's per-piece
// copies of A and B; slot 2 (shared_copy_padded) is read by every thread of a call.
std::vector<char>& padded_slot(int slot) {
  thread_local std::vector<char> buf[3];
  return buf[slot];
}
int64_t padded_ld(int64_t cols) {
  int64_t pld = (cols + 15) / 16 * 16;
  if (pld % kAliasedLd == 0) pld += 16;
  return pld;
}
int64_t copy_padded(const char* src, int64_t rows, int64_t cols, int64_t ld, int64_t es, int slot, const char** dst) {
  const int64_t pld = padded_ld(cols);
  std::vector<char>& b = padded_slot(slot);
  if (b.size() < static_cast<size_t>(rows * pld * es)) b.resize(static_cast<size_t>(rows * pld * es));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(b.data() + r * pld * es, src + r * ld * es, static_cast<size_t>(cols * es));
  *dst = b.data();
  return pld;
}

// C = alpha·op(A)·op(B) + beta·C as pieces (pieces_of, per batch entry), each through a fixed
// primitive built for one thread over its block of the operands (strided views: Key's ld fields),
// taken by `threads` threads in turn (one thread, or inside a parallel region: in order here).
// copy_padded into slot 2 of the calling thread, its rows shared out among `threads` threads: the
// operand every piece of a call reads, copied before the pieces start.
int64_t shared_copy_padded(const char* src, int64_t rows, int64_t cols, int64_t ld, int64_t es, int threads,
                           const char** dst) {
  const int64_t pld = padded_ld(cols);
  std::vector<char>& b = padded_slot(2);
  if (b.size() < static_cast<size_t>(rows * pld * es)) b.resize(static_cast<size_t>(rows * pld * es));
  char* out = b.data();
  const int64_t chunks = std::min<int64_t>(threads, std::max<int64_t>(1, rows * cols * es >> 16));  // ≥ 64 KiB each
  const int64_t per = (rows + chunks - 1) / chunks;
  run_pieces_in_turn(static_cast<size_t>(chunks), threads, [&](size_t j) {
    for (int64_t r = static_cast<int64_t>(j) * per, end = std::min(rows, r + per); r < end; ++r)
      std::memcpy(out + r * pld * es, src + r * ld * es, static_cast<size_t>(cols * es));
  });
  *dst = out;
  return pld;
}

// The piece of a 2-D product starting at i0 of the cut dim: rows i0.. of op(A) and of C (along M)
// or columns i0.. of op(B) and of C (along N). Moves a, b and c (operand row strides lda, ldb in
// elements of es bytes; C's rows d.n floats apart) to its block and returns its dims.
Dims piece_block(const Dims& d, const Pieces& pc, int64_t i0, Trans ta, Trans tb, int64_t lda, int64_t ldb,
                 int64_t es, const char*& a, const char*& b, char*& c) {
  Dims pd{1, 1, d.m, d.n, d.k};
  if (pc.along_m) {
    pd.m = std::min(pc.step, d.m - i0);
    a += (ta == Trans::N ? i0 * lda : i0) * es;
    c += i0 * d.n * static_cast<int64_t>(sizeof(float));
  } else {
    pd.n = std::min(pc.step, d.n - i0);
    b += (tb == Trans::N ? i0 : i0 * ldb) * es;
    c += i0 * static_cast<int64_t>(sizeof(float));
  }
  return pd;
}

// C = alpha·op(A)·op(B) + beta·C as pieces (pieces_of, per batch entry), each through a fixed
// primitive built for one thread over its block of the operands (strided views: Key's ld fields),
// taken by `threads` threads in turn (one thread, or inside a parallel region: in order here).
void run_pieces(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha,
                float beta, int threads) {
  // A batch of kMaxPieces or more already gives every thread whole entries to take: cutting each
  // one too only adds packing (Muon's Newton–Schulz on an expert stack: 256×256×1024 whole ran at
  // 64 GFLOP/s on one Zen 3 core, as four 64-row pieces at 57).
  const Pieces pc = d.batch >= kMaxPieces ? Pieces{true, d.m, 1} : pieces_of(d);
  const DType dtype = A.dtype();
  const auto dt = dnnl_type(static_cast<uint8_t>(dtype));
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  const int64_t lda = ta == Trans::N ? d.k : d.m, ldb = tb == Trans::N ? d.n : d.k, ldc = d.n;
  const auto* a0 = static_cast<const char*>(A.raw());
  const auto* b0 = static_cast<const char*>(B.raw());
  auto* c0 = static_cast<char*>(C.raw());
  auto no_copy = [](int64_t m, int64_t n) {
    return 1.0 / static_cast<double>(m) + 1.0 / static_cast<double>(n) >= kForceNoCopy;
  };
  // The operand every piece reads whole, padded once here when some piece (the last is the
  // smallest) runs on the no-copy kernels: B when cutting along M, A along N. One batch entry only
  // (a batch's pieces are mostly whole entries, each with its own operands).
  const char* shared = nullptr;
  int64_t shared_ld = 0;
  const int64_t last = pc.along_m ? d.m - (pc.count - 1) * pc.step : d.n - (pc.count - 1) * pc.step;
  if (d.batch == 1 && pc.count > 1 && no_copy(pc.along_m ? last : d.m, pc.along_m ? d.n : last)) {
    if (pc.along_m && pads_operand(ta, tb, false, ldb))
      shared_ld = tb == Trans::N ? shared_copy_padded(b0, d.k, d.n, ldb, es, threads, &shared)
                                 : shared_copy_padded(b0, d.n, d.k, ldb, es, threads, &shared);
    if (!pc.along_m && pads_operand(ta, tb, true, lda))
      shared_ld = ta == Trans::N ? shared_copy_padded(a0, d.m, d.k, lda, es, threads, &shared)
                                 : shared_copy_padded(a0, d.k, d.m, lda, es, threads, &shared);
  }
  const size_t count = static_cast<size_t>(d.batch * pc.count);
  auto run_one = [&](size_t j) {
    const int64_t bt = static_cast<int64_t>(j) / pc.count, i0 = (static_cast<int64_t>(j) % pc.count) * pc.step;
    const char* a = a0 + bt * d.m * d.k * es;
    const char* b = b0 + (d.batch_b > 1 ? bt * d.k * d.n * es : 0);
    char* c = c0 + bt * d.m * d.n * static_cast<int64_t>(sizeof(float));
    int64_t pa = lda, pb = ldb;  // this piece's row strides (padded copies: pads_operand)
    if (shared != nullptr && pc.along_m) b = shared, pb = shared_ld;
    if (shared != nullptr && !pc.along_m) a = shared, pa = shared_ld;
    const Dims pd = piece_block(d, pc, i0, ta, tb, pa, pb, es, a, b, c);
    if (no_copy(pd.m, pd.n)) {  // the operands not already padded above
      const bool a_whole = shared != nullptr && !pc.along_m, b_whole = shared != nullptr && pc.along_m;
      if (!a_whole && pads_operand(ta, tb, true, pa))
        pa = ta == Trans::N ? copy_padded(a, pd.m, pd.k, pa, es, 0, &a) : copy_padded(a, pd.k, pd.m, pa, es, 0, &a);
      if (!b_whole && pads_operand(ta, tb, false, pb))
        pb = tb == Trans::N ? copy_padded(b, pd.k, pd.n, pb, es, 1, &b) : copy_padded(b, pd.n, pd.k, pb, es, 1, &b);
    }
    Key key = make_key(pd, ta, tb, dtype, alpha, beta, 1);
    key.lda = pa;
    key.ldb = pb;
    key.ldc = ldc;
    Primitive prim = lookup(key);
    execute(prim, block_desc(pd.m, pd.k, ta, pa, dt), a, block_desc(pd.k, pd.n, tb, pb, dt), b,
            block_desc(pd.m, pd.n, Trans::N, ldc, memory::data_type::f32), c);
  };
  run_pieces_in_turn(count, threads, run_one);
}

// Taken pieces: an f32 2-D product on the avx512_core paths cut along its larger output dim into
// up to kTakenPieces spans of at least kMinTakenSpan rows or columns and kMinTakenFlops, each run
// through a primitive built for one thread over its block of the operands and taken by the
// threads as they free up. oneDNN's own threading splits a product evenly in advance, and on a
// shared VM the two vCPUs often run at different speeds, so one of them waits. One-thread brgemm
// pieces cost little (tools/onednn_piece_probe.cc, one Intel Xeon core, whole vs 8 pieces:
// 2048×512×256 NT 142–145 vs 143 GFLOP/s, 2048×256×512 NN 151–160 vs 152–158). A TN product's
// pieces run on oneDNN's jit gemm instead of brgemm: 128-row pieces of 512×256×2048 at 0–2% below
// the whole, 64-row ones 3–5%, hence 128 rows. The router's
// 2048×64×256 in 8 pieces of 8 MFLOP ran at 158–190 against 200–215 GFLOP/s whole: hence 32 MFLOP.
// The demo step: 1.015× and 1.016× (paired medians of 16 and 12 alternations; docs/ops-gemm.md).
// The cut depends on the shape alone, so the bits do not depend on the thread count.
constexpr int64_t kTakenPieces = 8, kMinTakenSpan = 128;
constexpr double kMinTakenFlops = 32e6;
std::atomic<bool> g_taken_pieces{true};
Pieces taken_pieces_of(const Dims& d, DType dtype) {
  if (!g_taken_pieces.load(std::memory_order_relaxed) || d.batch != 1 || dtype != DType::f32)
    return {true, d.m, 1};
  const bool along_m = d.m >= d.n;
  const int64_t dim = along_m ? d.m : d.n;
  const double flops = flops_of(1, d.m, d.n, d.k);
  int64_t count = std::min<int64_t>(kTakenPieces, dim / kMinTakenSpan);
  count = std::min<int64_t>(count, static_cast<int64_t>(flops / kMinTakenFlops));
  if (count < 3) return {true, d.m, 1};  // two pieces on two threads is the even split again
  const int64_t step = ((dim + count - 1) / count + 15) / 16 * 16;
  return {along_m, step, (dim + step - 1) / step};
}

void run_taken_pieces(const Dims& d, const Pieces& pc, const Tensor& A, Trans ta, const Tensor& B, Trans tb,
                      const Tensor& C, float alpha, float beta, int threads) {
  const auto dt = dnnl_type(static_cast<uint8_t>(A.dtype()));
  const int64_t es = static_cast<int64_t>(dtype_size(A.dtype()));
  const int64_t lda = ta == Trans::N ? d.k : d.m, ldb = tb == Trans::N ? d.n : d.k;
  const auto* a0 = static_cast<const char*>(A.raw());
  const auto* b0 = static_cast<const char*>(B.raw());
  auto* c0 = static_cast<char*>(C.raw());
  run_pieces_in_turn(static_cast<size_t>(pc.count), threads, [&](size_t j) {
    const int64_t i0 = static_cast<int64_t>(j) * pc.step;
    const char* a = a0;
    const char* b = b0;
    char* c = c0;
    const Dims pd = piece_block(d, pc, i0, ta, tb, lda, ldb, es, a, b, c);
    Key key = make_key(pd, ta, tb, A.dtype(), alpha, beta, 1);
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = d.n;
    Primitive prim = lookup(key);
    execute(prim, block_desc(pd.m, pd.k, ta, lda, dt), a, block_desc(pd.k, pd.n, tb, ldb, dt), b,
            block_desc(pd.m, pd.n, Trans::N, d.n, memory::data_type::f32), c);
  });
}

// One problem, checked and non-trivial: run_pieces where oneDNN's results depend on the thread
// count; otherwise taken pieces where the product is large enough to cut, run_fixed where not.
void run_plain(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha,
               float beta, int threads) {
  if (threads_change_bits()) {
    run_pieces(d, A, ta, B, tb, C, alpha, beta, threads);
    return;
  }
  const Pieces pc = taken_pieces_of(d, A.dtype());
  if (pc.count > 1)
    run_taken_pieces(d, pc, A, ta, B, tb, C, alpha, beta, threads);
  else
    run_fixed(d, A, ta, B, tb, C, alpha, beta, threads);
}

// x's bf16 elements as f32 at dst (exact), as a tensor of x's shape over dst.
Tensor widen_into(const Tensor& x, float* dst) {
  const bf16* src = x.data<bf16>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16) && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  return Tensor::borrow(dst, x.shape(), DType::f32);
}

// bf16 operands widened to f32 in this thread's scratch (kept from call to call), for CPUs
// without a bf16 matmul: `slot` picks one of the scratch buffers so that A and B can both live.
Tensor widen_bf16(const Tensor& x, int slot) {
  thread_local std::vector<float> scratch[2];
  std::vector<float>& buf = scratch[slot];
  if (buf.size() < static_cast<size_t>(x.numel())) buf.resize(static_cast<size_t>(x.numel()));
  return widen_into(x, buf.data());
}

// ----------------------------------------------------------------------------- grouped GEMM
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
// copies only cost: on 2 Zen 4 cores (bench_ops_gemm vs_square, 2026-11-25) the demo's grouped
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
bool may_run_past_end(const Dims& d, const GemmProblem& p, const GemmProblem* next, int64_t rows, float beta) {
  if (beta != 0.0f || next == nullptr || rows == d.m) return false;
  const Tensor& nc = next->C;
  if (nc.ndim() != 2 || nc.size(1) != d.n || nc.size(0) < rows - d.m) return false;
  if (static_cast<const char*>(nc.raw()) != static_cast<const char*>(p.C.raw()) + d.m * d.n * sizeof(float))
    return false;
  const Storage& sa = *p.A.storage();
  const char* a_end = static_cast<const char*>(p.A.raw()) + rows * d.k * static_cast<int64_t>(dtype_size(p.A.dtype()));
  return sa.bytes > 0 && a_end <= static_cast<const char*>(sa.ptr) + sa.bytes;
}

template <class T>
void run_row_blocked(const Dims& d, const Tensor& A, const Tensor& B, Trans tb, const Tensor& C, float alpha,
                     float beta, bool past_end_ok, int threads) {
  if (past_end_ok) {  // one GEMM of whole blocks, in place (may_run_past_end)
    const int64_t rows = (d.m + kRowBlock - 1) / kRowBlock * kRowBlock;
    auto dt = dnnl_type(static_cast<uint8_t>(A.dtype()));
    Primitive prim = lookup(make_key(Dims{1, 1, rows, d.n, d.k}, Trans::N, tb, A.dtype(), alpha, beta, threads));
    execute(prim, operand_desc(1, rows, d.k, Trans::N, dt), A.raw(), operand_desc(1, d.k, d.n, tb, dt), B.raw(),
            operand_desc(1, rows, d.n, Trans::N, memory::data_type::f32), C.raw());
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
// (4 alternations of bench_ops_gemm gemm_grouped/zaya1 with a temporary switch, 2026-11-25), its
// dx 0.89–1.31× (median 1.06×).
constexpr double kMaxImbalance = 1.2;
std::atomic<bool> g_side_by_side{true};
bool split_problems(std::span<GemmProblem> problems, const std::vector<Dims>& dims, const std::vector<size_t>& todo,
                    Trans ta, int threads, std::vector<size_t>& order) {
  if (!g_side_by_side.load(std::memory_order_relaxed)) return false;
  if (threads < 2 || todo.size() < static_cast<size_t>(threads) || omp_in_parallel()) return false;
  // Problems that write overlapping C (several groups accumulating into one gradient, beta = 1)
  // must run in order, as a serial call runs them.
  std::vector<std::pair<const char*, const char*>> spans;
  for (size_t i : todo) {
    const auto* c = static_cast<const char*>(problems[i].C.raw());
    spans.emplace_back(c, c + problems[i].C.nbytes());
  }
  std::sort(spans.begin(), spans.end());
  for (size_t j = 1; j < spans.size(); ++j)
    if (spans[j].first < spans[j - 1].second) return false;
  std::vector<double> work(todo.size());
  double total = 0;
  for (size_t j = 0; j < todo.size(); ++j) {
    const Dims& d = dims[todo[j]];
    const bool large = (ta == Trans::N ? d.n * d.k : d.m * d.n) >= kLargeWeight;
    const bool bf16_runtime_m = ta == Trans::N && problems[todo[j]].A.dtype() == DType::bf16 && !bf16_fixed_shapes();
    if (large && !bf16_runtime_m) return false;  // see above
    work[j] = flops_of(d.batch, d.m, d.n, d.k);
    total += work[j];
  }
  order.resize(todo.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return work[a] > work[b]; });
  // The plan the threads will roughly follow (each free thread takes the next largest): if even
  // that leaves one thread far busier than the mean, the call stays serial.
  std::vector<double> load(static_cast<size_t>(threads), 0.0);
  for (size_t j : order) *std::min_element(load.begin(), load.end()) += work[j];
  return *std::max_element(load.begin(), load.end()) <= kMaxImbalance * total / threads;
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
  TimeCounters& tc = time_counters();
  tc.side_by_side_calls.fetch_add(1, std::memory_order_relaxed);
  tc.side_by_side_gap_ns.fetch_add(std::max<int64_t>(0, last_done.load() - first_done.load()),
                                   std::memory_order_relaxed);
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
  if (!g_amx_enabled.load(std::memory_order_relaxed) || alpha != 1.0f || (beta != 0.0f && beta != 1.0f)) return false;
  if (ta == Trans::T && tb == Trans::T) return false;
  for (const GemmProblem& p : problems) {  // malformed problems go on to check_problem's errors
    if (!p.A.defined() || !p.B.defined() || !p.C.defined()) return false;
    if (p.A.dtype() != DType::bf16 || p.A.ndim() != 2 || p.B.ndim() != 2) return false;
    int64_t m, k, kb, n;
    op_dims(p.A, ta, m, k);
    op_dims(p.B, tb, kb, n);
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
  return {static_cast<size_t>(cpu::amx_packed_b_elems(d.k, d.n)), ta == Trans::T ? static_cast<size_t>(d.m * kp) : 0,
          ta == Trans::T ? kp : d.k};
}

// Packs problem p into its slot; then multiplies from it. `whole`: this thread does the whole
// problem (side by side), otherwise every thread of the region its share (amx_gemm.h).
void amx_pack(const GemmProblem& p, const Dims& d, const AmxSlot& s, Trans ta, Trans tb, bf16* slot, bool whole) {
  cpu::amx_pack_b(slot, p.B.data<bf16>(), p.B.size(1), d.k, d.n, tb == Trans::T, whole);
  if (ta == Trans::T) cpu::amx_transpose_a(slot + s.b_elems, p.A.data<bf16>(), d.m, d.k, d.m, whole);
}
void amx_multiply(const GemmProblem& p, const Dims& d, const AmxSlot& s, Trans ta, const bf16* slot, bool accumulate,
                  bool whole) {
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
  if (split_problems(problems, dims, todo, ta, threads, order)) {
    // Side by side (as for oneDNN's path, see split_problems): each thread packs its problem into
    // its own scratch and multiplies right after, with no barrier in between; its packed B is
    // still in its L2. amx_gemm sums each C element in k order on one thread either way, so the
    // bits are those of the chunked path below.
    run_side_by_side(order.size(), threads, [] { cpu::amx_tile_begin(); }, [&](size_t j) {
      const size_t i = todo[order[j]];
      std::vector<bf16>& buf = amx_scratch();
      if (buf.size() < slots[i].b_elems + slots[i].a_elems) buf.resize(slots[i].b_elems + slots[i].a_elems);
      amx_pack(problems[i], dims[i], slots[i], ta, tb, buf.data(), true);
      amx_multiply(problems[i], dims[i], slots[i], ta, buf.data(), accumulate, true);
    }, [] { cpu::amx_tile_end(); });
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

// One problem of a grouped call (checked, non-trivial) through the oneDNN path that suits it (see
// the list above). `next_after`: problem i+1 is non-trivial and runs after this one on the same
// thread, so this one may write its rows past the end (may_run_past_end).
void run_grouped_problem(std::span<GemmProblem> problems, size_t i, const Dims& d, Trans ta, Trans tb, float alpha,
                         float beta, int threads, bool next_after) {
  GemmProblem& p = problems[i];
  if (d.batch != 1 || p.A.ndim() != 2 || p.B.ndim() != 2) {  // batched groups: per shape
    run_plain(d, p.A, ta, p.B, tb, p.C, alpha, beta, threads);
    return;
  }
  const bool is_bf16 = p.A.dtype() == DType::bf16;
  if (ta == Trans::N && (is_bf16 ? d.n * d.k < kLargeWeight && bf16_fixed_shapes() : d.n * d.k >= kLargeWeight)) {
    const GemmProblem* next = next_after ? &problems[i + 1] : nullptr;
    const bool past_end_ok = may_run_past_end(d, p, next, (d.m + kRowBlock - 1) / kRowBlock * kRowBlock, beta);
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
  if (!run_runtime(d, p.A, ta, p.B, tb, p.C, alpha, beta, ta == Trans::N, ta == Trans::T, threads))
    run_fixed(d, p.A, ta, p.B, tb, p.C, alpha, beta, threads);
}

// Rows [r0, r0 + rows) of a 2-D grouped problem with tokens in M (x·Wᵀ, dy·W), on one thread
// through run_grouped_problem's paths: the token count stays a runtime dim, and each row's result
// is the whole problem's.
void run_grouped_rows(const GemmProblem& p, const Dims& d, int64_t r0, int64_t rows, Trans ta, Trans tb,
                      float alpha, float beta) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.A.dtype()));
  GemmProblem piece{Tensor::borrow(static_cast<char*>(p.A.raw()) + r0 * d.k * es, {rows, d.k}, p.A.dtype()), p.B,
                    Tensor::borrow(p.C.data<float>() + r0 * d.n, {rows, d.n}, DType::f32)};
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
              block_desc(d.k, d.n, Trans::N, pld, dt), w, block_desc(rows, d.n, Trans::N, d.n, memory::data_type::f32),
              p.C.data<float>() + i0 * d.n);
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
constexpr int64_t kMinHalfRows = 64;
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

}  // namespace

void gemm(const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha, float beta) {
  Dims d = check_problem(A, ta, B, tb, C);
  if (trivial(d, C, beta)) return;
  TimedCall timed;
  timed.add_flops(flops_of(d.batch, d.m, d.n, d.k));
  if (timed.wants_label()) timed.set_label(shape_label(false, ta, tb, d.batch, d.m, d.n, d.k, A.dtype()));
  if (A.dtype() == DType::bf16 && !bf16_matmul_native())
    run_plain(d, widen_bf16(A, 0), ta, widen_bf16(B, 1), tb, C, alpha, beta, num_threads());
  else
    run_plain(d, A, ta, B, tb, C, alpha, beta, num_threads());
}

void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  // Groups run one after another so each GEMM gets every thread and the order of work is fixed.
  // Which dims vary from group to group (and step to step) is read off the problems: the token
  // count is M for ta = N (x·Wᵀ, dy·W) and K for ta = T (dyᵀ·x); N (and K for ta = N) are the
  // expert weight's, shared by all groups.
  if (!bf16_matmul_native() &&
      std::any_of(problems.begin(), problems.end(), [](const GemmProblem& p) {
        return p.A.defined() && p.B.defined() && (p.A.dtype() == DType::bf16 || p.B.dtype() == DType::bf16);
      })) {
    for (GemmProblem& p : problems) check_problem(p.A, ta, p.B, tb, p.C);  // errors name the caller's shapes
    std::vector<GemmProblem> wide = widen_problems(problems);
    gemm_grouped(wide, ta, tb, alpha, beta);
    return;
  }
  TimedCall timed;
  if (amx_fits(problems, ta, tb, alpha, beta)) {
    std::vector<Dims> dims;
    dims.reserve(problems.size());
    for (GemmProblem& p : problems) {
      Dims d = check_problem(p.A, ta, p.B, tb, p.C);
      if (trivial(d, p.C, beta)) d.m = 0;  // nothing left for the kernel
      timed.add_flops(flops_of(d.batch, d.m, d.n, d.k));
      if (timed.wants_label())
        timed.set_label(shape_label(true, ta, tb, 1, ta == Trans::N ? -1 : d.m, d.n, ta == Trans::T ? -1 : d.k,
                                    p.A.dtype()));
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
    d = check_problem(p.A, ta, p.B, tb, p.C);
    if (trivial(d, p.C, beta)) continue;
    timed.add_flops(flops_of(d.batch, d.m, d.n, d.k));
    if (timed.wants_label())  // the token dim is M for ta = N and K for ta = T
      timed.set_label(shape_label(true, ta, tb, 1, ta == Trans::N ? -1 : d.m, d.n, ta == Trans::T ? -1 : d.k,
                                  p.A.dtype()));
    todo.push_back(i);
  }
  const int threads = num_threads();
  std::vector<size_t> order;
  if (split_problems(problems, dims, todo, ta, threads, order)) {
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

bool gemm_grouped_side_by_side_plan(std::span<GemmProblem> problems, Trans ta, Trans tb,
                                    std::vector<size_t>& order) {
  std::vector<Dims> dims(problems.size());
  std::vector<size_t> todo, planned;
  for (size_t i = 0; i < problems.size(); ++i) {
    const Dims& d = dims[i] = check_problem(problems[i].A, ta, problems[i].B, tb, problems[i].C);
    if (d.batch > 0 && d.m > 0 && d.n > 0 && d.k > 0)
      todo.push_back(i);  // trivial()'s test, without its writes
  }
  if (!split_problems(problems, dims, todo, ta, num_threads(), planned)) return false;
  order.clear();
  for (size_t j : planned) order.push_back(todo[j]);
  return true;
}

void gemm_grouped_on_this_thread(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha,
                                 float beta) {
  for (size_t i = 0; i < problems.size(); ++i) {
    GemmProblem& p = problems[i];
    const Dims d = check_problem(p.A, ta, p.B, tb, p.C);
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

void gemm_force_avx2_paths(bool on) { g_force_avx2_paths = on; }

void gemm_taken_pieces(bool on) { g_taken_pieces = on; }

bool gemm_avx2_paths() { return threads_change_bits(); }

bool gemm_bf16_native() { return bf16_matmul_native(); }

void gemm_grouped_side_by_side(bool on) { g_side_by_side = on; }

void gemm_force_bf16_fixed_shapes(bool on) { g_force_bf16_fixed_shapes = on; }

GemmCacheStats gemm_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.hits, c.misses, static_cast<int64_t>(c.lru.size())};
}

GemmTimeStats gemm_time_stats() {
  TimeCounters& t = time_counters();
  return {t.calls.load(), static_cast<double>(t.nanoseconds.load()) * 1e-9, t.flops.load(),
          t.side_by_side_calls.load(), static_cast<double>(t.side_by_side_gap_ns.load()) * 1e-9};
}

void gemm_time_reset() {
  TimeCounters& t = time_counters();
  t.calls = 0;
  t.nanoseconds = 0;
  t.flops = 0.0;
  t.side_by_side_calls = 0;
  t.side_by_side_gap_ns = 0;
  std::lock_guard<std::mutex> lock(t.mu);
  t.shapes.clear();
}

void gemm_time_record(const std::string& shape, double seconds, double flops) {
  const bool per_shape = time_counters().per_shape.load(std::memory_order_relaxed);
  record_call(static_cast<int64_t>(seconds * 1e9), flops, per_shape ? shape : std::string());
}

void gemm_profile_shapes(bool on) { time_counters().per_shape = on; }

std::vector<GemmShapeTime> gemm_shape_times() {
  TimeCounters& t = time_counters();
  std::vector<GemmShapeTime> rows;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (const auto& [label, row] : t.shapes) rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end(), [](const GemmShapeTime& a, const GemmShapeTime& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.shape < b.shape;
  });
  return rows;
}

void gemm_cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.lru.clear();
  c.index.clear();
  c.hits = c.misses = 0;
}

}  // namespace zaya::ops
