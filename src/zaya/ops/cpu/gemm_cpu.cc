// The CPU GEMM through oneDNN matmul (gemm.h; arguments checked by the fronts in ops/gemm.cc): the
// primitive cache, one product (gemm), the pieces, and the time counters. oneDNN describes a
// transposed operand with strides instead of a copy, so all four transpose combinations run without
// moving data. The expert GEMMs (gemm_grouped) are in gemm_grouped_cpu.cc; what the two share is
// declared in gemm_onednn.h.
#include "zaya/ops/cpu/gemm_cpu.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <list>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "zaya/core/threads.h"
#include "zaya/ops/cpu/gemm_onednn.h"

namespace zaya::ops::cpu::gemm_detail {

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

bool profiling_shapes() { return time_counters().per_shape.load(std::memory_order_relaxed); }

void record_side_by_side(int64_t gap_ns) {
  TimeCounters& t = time_counters();
  t.side_by_side_calls.fetch_add(1, std::memory_order_relaxed);
  t.side_by_side_gap_ns.fetch_add(gap_ns, std::memory_order_relaxed);
}

double flops_of(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

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
constexpr double kMinPieceFlops = 4e6;  // kForceNoCopy: gemm_onednn.h
Pieces pieces_of(const Dims& d, bool m_only) {
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
// (tools/onednn_piece_probe.cc, one Zen 3 core):
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

// Whether oneDNN may split this product's reduction dim among its threads, which makes the sums
// depend on the thread count. brgemm does so for Aᵀ·B (weight gradients, K = the tokens) when few
// output blocks are left to share out: on the 2-core Intel VM (oneDNN 2.6.3) every M × N with N ≤ 64
// at K = 2,048 differed between 1 and 2 threads (the demo router's 64×64 and 9×64 gradients among
// them); at K = 8,192 on 8 threads every shape tried differed, up to 1024 × 256
// (tools/gemm_split_k_probe.cc; A·B through these fixed-shape primitives never did: the grouped
// calls' runtime-M kernel did, see gemm_grouped.cc, run_grouped_problem). So an f32 Aᵀ·B that is not cut into
// pieces runs on one thread, and a bf16 one when its output is small (M·N ≤ 2^16: without this,
// 256×64×2048 and 64×128×8192 in bf16 differed on 2–4 threads; a larger bf16 weight gradient, the
// bf16 LM head's, keeps every thread and is not thread-count free).
// `Gemm.SmallOutputProductsAreThreadCountFree`, `ZayaModel.DeterministicAcrossRunsAndThreadCounts`.
bool reduction_may_split(const Dims& d, Trans ta, DType dtype) {
  if (ta != Trans::T || d.batch != 1) return false;
  return dtype == DType::f32 || d.m * d.n <= (int64_t{1} << 16);
}

// One problem, checked and non-trivial: run_pieces where oneDNN's results depend on the thread
// count; otherwise taken pieces where the product is large enough to cut, run_fixed where not (on
// one thread where its reduction may split).
void run_plain(const Dims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha,
               float beta, int threads) {
  if (threads_change_bits()) {
    run_pieces(d, A, ta, B, tb, C, alpha, beta, threads);
    return;
  }
  const Pieces pc = taken_pieces_of(d, A.dtype());
  if (pc.count > 1) {
    run_taken_pieces(d, pc, A, ta, B, tb, C, alpha, beta, threads);
  } else if (reduction_may_split(d, ta, A.dtype())) {
    OneThread one;
    run_fixed(d, A, ta, B, tb, C, alpha, beta, 1);
  } else {
    run_fixed(d, A, ta, B, tb, C, alpha, beta, threads);
  }
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

}  // namespace zaya::ops::cpu::gemm_detail

namespace zaya::ops::cpu {

using namespace gemm_detail;

void gemm(const GemmDims& d, const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha,
          float beta) {
  if (trivial(d, C, beta)) return;
  TimedCall timed;
  timed.add_flops(flops_of(d.batch, d.m, d.n, d.k));
  if (timed.wants_label()) timed.set_label(shape_label(false, ta, tb, d.batch, d.m, d.n, d.k, A.dtype()));
  if (A.dtype() == DType::bf16 && !bf16_matmul_native())
    run_plain(d, widen_bf16(A, 0), ta, widen_bf16(B, 1), tb, C, alpha, beta, num_threads());
  else
    run_plain(d, A, ta, B, tb, C, alpha, beta, num_threads());
}

void gemm_force_avx2_paths(bool on) { g_force_avx2_paths = on; }

void gemm_taken_pieces(bool on) { g_taken_pieces = on; }

bool gemm_avx2_paths() { return threads_change_bits(); }

bool gemm_bf16_native() { return bf16_matmul_native(); }

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

}  // namespace zaya::ops::cpu
