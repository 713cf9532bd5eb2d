// Communicator semantics. The local backend runs in-process; the MPI backend runs this same test
// binary under `mpirun -np 2` and `-np 3` (MpiSelf.* only runs as such a child, see
// MpiIntegration.CommunicatorOps in mpi_bench_test.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist {
namespace {

TEST(LocalCommunicator, IsAWorldOfOneThatCopies) {
  auto c = make_local_communicator();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  std::vector<float> a = {1, 2, 3}, b(3, 0);
  c->all_reduce(a.data(), b.data(), 3, DType::f32);
  EXPECT_EQ(b, a);
  std::vector<float> d(3, 0);
  c->all_to_all(a.data(), d.data(), 3, DType::f32);
  EXPECT_EQ(d, a);
  c->all_reduce(a.data(), a.data(), 3, DType::f32);  // in place: unchanged
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(c->host_max(2.5), 2.5);
  EXPECT_EQ(c->host_sum(7), 7);
  EXPECT_THROW(c->send(a.data(), 1, DType::f32, 1), Error);
  EXPECT_THROW(c->broadcast(a.data(), a.data(), 1, DType::f32, 1), Error);
}

TEST(Communicator, BackendNamesParse) {
  bool is_auto = false;
  EXPECT_EQ(parse_backend("mpi", "--backend", &is_auto), Backend::mpi);
  EXPECT_FALSE(is_auto);
  parse_backend("auto", "--backend", &is_auto);
  EXPECT_TRUE(is_auto);
  EXPECT_THROW(parse_backend("gloo", "--backend", &is_auto), Error);
}

// ---- MPI child: every collective on small integers, whose sums are exact in f32 and bf16. ----

bool is_mpi_child() { return std::getenv("ZAYA_MPI_SELF_TEST") != nullptr; }

TEST(MpiSelf, EveryOperation) {
  if (!is_mpi_child()) GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.CommunicatorOps";
  auto c = make_mpi_communicator({.timeout_s = 20});
  const int n = c->size(), me = c->rank();
  ASSERT_GE(n, 2);
  const size_t k = 5;  // elements per rank block: odd on purpose

  // all_reduce, f32 out of place and bf16 in place.
  std::vector<float> x(k), y(k);
  for (size_t i = 0; i < k; ++i) x[i] = static_cast<float>(me + i);
  c->all_reduce(x.data(), y.data(), k, DType::f32);
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(y[i], n * (n - 1) / 2.0f + n * static_cast<float>(i));
  std::vector<bf16> h(k);
  for (size_t i = 0; i < k; ++i) h[i] = to_bf16(static_cast<float>(me * 3 + i));
  c->all_reduce(h.data(), h.data(), k, DType::bf16);
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(to_float(h[i]), 3.0f * n * (n - 1) / 2 + n * static_cast<float>(i));

  // bf16 sums are rounded to nearest even, not truncated: at 256 bf16 steps by 2, so 256 + 1 is
  // a tie that goes to 256 and 256 + 3 a tie that goes to 260 (truncation would give 258).
  if (n == 2) {
    bf16 v = to_bf16(me == 0 ? 256.0f : 1.0f);
    c->all_reduce(&v, &v, 1, DType::bf16);
    EXPECT_EQ(to_float(v), 256.0f);
    bf16 w = to_bf16(me == 0 ? 256.0f : 3.0f);
    c->all_reduce(&w, &w, 1, DType::bf16);
    EXPECT_EQ(to_float(w), 260.0f);
  }

  // reduce_scatter, out of place and in place (block `me` lands at offset me*k).
  std::vector<float> full(n * k), part(k);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i % 7 + me);
  c->reduce_scatter(full.data(), part.data(), k, DType::f32);
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(part[i], n * static_cast<float>((me * k + i) % 7) + n * (n - 1) / 2.0f);
  c->reduce_scatter(full.data(), full.data() + me * k, k, DType::f32);
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(full[me * k + i], part[i]);

  // all_gather, out of place and in place.
  std::vector<int32_t> mine(k), all(n * k, -1);
  for (size_t i = 0; i < k; ++i) mine[i] = me * 100 + static_cast<int32_t>(i);
  c->all_gather(mine.data(), all.data(), k, DType::i32);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(all[j * k + i], j * 100 + static_cast<int32_t>(i));
  std::vector<int32_t> all2(n * k, -1);
  std::copy(mine.begin(), mine.end(), all2.begin() + me * k);
  c->all_gather(all2.data() + me * k, all2.data(), k, DType::i32);
  EXPECT_EQ(all2, all);

  // broadcast from the last rank.
  std::vector<int64_t> b(k, me);
  c->broadcast(b.data(), b.data(), k, DType::i64, n - 1);
  for (auto v : b) EXPECT_EQ(v, n - 1);

  // all_to_all: block j of rank r holds r*1000 + j*10 + i; rank me receives j*1000 + me*10 + i.
  std::vector<int32_t> s(n * k), r(n * k);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) s[j * k + i] = me * 1000 + j * 10 + static_cast<int32_t>(i);
  c->all_to_all(s.data(), r.data(), k, DType::i32);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(r[j * k + i], j * 1000 + me * 10 + static_cast<int32_t>(i));
  c->all_to_all(s.data(), s.data(), k, DType::i32);  // in place
  EXPECT_EQ(s, r);

  // send/recv around a ring; even ranks send first so nothing depends on eager buffering.
  int32_t out = me, in = -1;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  if (me % 2 == 0) {
    c->send(&out, 1, DType::i32, next, 3);
    c->recv(&in, 1, DType::i32, prev, 3);
  } else {
    c->recv(&in, 1, DType::i32, prev, 3);
    c->send(&out, 1, DType::i32, next, 3);
  }
  EXPECT_EQ(in, prev);

  EXPECT_EQ(c->host_max(static_cast<double>(me)), n - 1.0);
  EXPECT_EQ(c->host_sum(me + 1), static_cast<int64_t>(n) * (n + 1) / 2);
  EXPECT_THROW(c->send(&out, 1, DType::i32, me), Error);  // to itself
  c->barrier();
}

}  // namespace
}  // namespace zaya::dist
