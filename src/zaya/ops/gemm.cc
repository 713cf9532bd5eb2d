// GEMM through oneDNN matmul (see gemm.h). oneDNN describes a transposed operand with strides
// instead of a copy, so all four transpose combinations run without moving data.
#include "zaya/ops/gemm.h"

#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "zaya/core/threads.h"
#include "zaya/ops/cpu/op_checks.h"

namespace zaya::ops {
namespace {

using dnnl::memory;

// Everything that changes the primitive oneDNN builds. The thread count is part of it because
// oneDNN fixes its work partition (and so the reduction order) when the primitive is created.
struct Key {
  int64_t batch_a, batch_b, m, n, k;
  uint8_t ta, tb, dtype;
  uint32_t alpha_bits, beta_bits;
  int threads;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(k.batch_a); mix(k.batch_b); mix(k.m); mix(k.n); mix(k.k);
    mix(k.ta | (k.tb << 8) | (k.dtype << 16)); mix(k.alpha_bits); mix(k.beta_bits);
    mix(static_cast<uint64_t>(k.threads));
    return h;
  }
};

// A bounded LRU: expert GEMMs see a new M almost every step, and an unbounded cache would grow
// with every token count ever seen. 512 entries hold a whole model's fixed shapes with room.
constexpr size_t kCacheCapacity = 512;

struct Cache {
  std::mutex mu;
  std::list<std::pair<Key, dnnl::matmul>> lru;  // front = most recently used
  std::unordered_map<Key, std::list<std::pair<Key, dnnl::matmul>>::iterator, KeyHash> index;
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

dnnl::matmul build(const Key& k) {
  auto dt = k.dtype == static_cast<uint8_t>(DType::bf16) ? memory::data_type::bf16 : memory::data_type::f32;
  memory::desc a = operand_desc(k.batch_a, k.m, k.k, static_cast<Trans>(k.ta), dt);
  memory::desc b = operand_desc(k.batch_b, k.k, k.n, static_cast<Trans>(k.tb), dt);
  memory::desc c = operand_desc(k.batch_a, k.m, k.n, Trans::N, memory::data_type::f32);
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
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  return dnnl::matmul(pd);
}

dnnl::matmul lookup(const Key& k) {
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

}  // namespace

void gemm(const Tensor& A, Trans ta, const Tensor& B, Trans tb, const Tensor& C, float alpha, float beta) {
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
  ZAYA_CHECK(B.ndim() == 2 || B.ndim() == A.ndim(), op, ": B ", B.str(), " must be 2-D or match A ",
             A.str());
  int64_t batch = A.ndim() == 3 ? A.size(0) : 1;
  int64_t batch_b = B.ndim() == 3 ? B.size(0) : 1;
  ZAYA_CHECK(batch_b == batch || B.ndim() == 2, op, ": batch of B ", B.str(), " differs from A ", A.str());
  int64_t m, k, kb, n;
  op_dims(A, ta, m, k);
  op_dims(B, tb, kb, n);
  ZAYA_CHECK(k == kb, op, ": inner dims differ: op(A) is [", m, ", ", k, "] from A ", A.str(),
             ", op(B) is [", kb, ", ", n, "] from B ", B.str());
  Shape expect = A.ndim() == 3 ? Shape{batch, m, n} : Shape{m, n};
  check_shape("gemm: C", C, expect);
  ZAYA_CHECK(!overlaps(C, A) && !overlaps(C, B), op, ": C must not overlap A or B");
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // an empty sum: C = beta·C (and exactly 0 for beta = 0, even over NaN garbage)
    float* c = C.data<float>();
    for (int64_t i = 0; i < C.numel(); ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  Key key{batch, batch_b, m, n, k, static_cast<uint8_t>(ta), static_cast<uint8_t>(tb),
          static_cast<uint8_t>(A.dtype()), bits_of(alpha), bits_of(beta), num_threads()};
  dnnl::matmul prim = lookup(key);
  auto dt = A.dtype() == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory am(operand_desc(batch, m, k, ta, dt), engine(), A.raw());
  memory bm(operand_desc(batch_b, k, n, tb, dt), engine(), B.raw());
  memory cm(operand_desc(batch, m, n, Trans::N, memory::data_type::f32), engine(), C.raw());
  thread_local dnnl::stream stream(engine());
  prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}

void gemm_grouped(std::span<GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  // One cached primitive per distinct shape; experts with equal token counts share one. Groups run
  // one after another so each GEMM gets every thread and the order of work is fixed.
  for (GemmProblem& p : problems) gemm(p.A, ta, p.B, tb, p.C, alpha, beta);
}

GemmCacheStats gemm_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.hits, c.misses, static_cast<int64_t>(c.lru.size())};
}

void gemm_cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.lru.clear();
  c.index.clear();
  c.hits = c.misses = 0;
}

}  // namespace zaya::ops
