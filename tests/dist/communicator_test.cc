// Communicator semantics. The local backend runs in-process; the MPI backend runs this same test
// binary under `mpirun -np 2` and `-np 3` (MpiSelf.* only runs as such a child, see
// MpiIntegration.CommunicatorOps in mpi_bench_test.cc), and the NCCL backend the same checks on
// device buffers where a GPU is (NcclWorld.*; scripts/gpu_check.sh runs it on a lent GPU machine).
#include "zaya/dist/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "communicator_test_util.h"
#include "test_util.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/dtype.h"
#include "zaya/core/tensor.h"

namespace zaya::dist {
using test_support::Buf;
using test_support::check_every_operation;
using test_support::check_meshes;
using test_support::check_nonblocking;
using test_support::is_mpi_child;
using test_support::is_singleton_child;
using test_support::run_as_singleton_child;


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

// ---- Every collective on small integers, whose sums are exact in f32 and bf16: the MPI backend as
// an mpirun child, the NCCL backend on a GPU (a world of one here; more ranks under mpirun). ----

// The checks hold for any world size n >= 1 (the ring of sends needs a peer, so n >= 2).
void test_support::check_every_operation(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const size_t k = 5;  // elements per rank block: odd on purpose

  // all_reduce, f32 out of place and bf16 in place.
  std::vector<float> xv(k);
  for (size_t i = 0; i < k; ++i) xv[i] = static_cast<float>(me + i);
  Buf<float> x(c, xv), y(c, k, -1.0f);
  c.all_reduce(x.data(), y.data(), k, DType::f32);
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(y.get()[i], n * (n - 1) / 2.0f + n * static_cast<float>(i));
  std::vector<bf16> hv(k);
  for (size_t i = 0; i < k; ++i) hv[i] = to_bf16(static_cast<float>(me * 3 + i));
  Buf<bf16> h(c, hv);
  c.all_reduce(h.data(), h.data(), k, DType::bf16);
  for (size_t i = 0; i < k; ++i)
    EXPECT_EQ(to_float(h.get()[i]), 3.0f * n * (n - 1) / 2 + n * static_cast<float>(i));

  // bf16 sums are rounded to nearest even, not truncated: at 256 bf16 steps by 2, so 256 + 1 is
  // a tie that goes to 256 and 256 + 3 a tie that goes to 260 (truncation would give 258).
  if (n == 2) {
    Buf<bf16> v(c, {to_bf16(me == 0 ? 256.0f : 1.0f)});
    c.all_reduce(v.data(), v.data(), 1, DType::bf16);
    EXPECT_EQ(to_float(v.get()[0]), 256.0f);
    Buf<bf16> w(c, {to_bf16(me == 0 ? 256.0f : 3.0f)});
    c.all_reduce(w.data(), w.data(), 1, DType::bf16);
    EXPECT_EQ(to_float(w.get()[0]), 260.0f);
  }

  // reduce_scatter, out of place and in place (block `me` lands at offset me*k).
  std::vector<float> fullv(n * k);
  for (size_t i = 0; i < fullv.size(); ++i) fullv[i] = static_cast<float>(i % 7 + me);
  Buf<float> full(c, fullv), part(c, k, -1.0f);
  c.reduce_scatter(full.data(), part.data(), k, DType::f32);
  for (size_t i = 0; i < k; ++i)
    EXPECT_EQ(part.get()[i], n * static_cast<float>((me * k + i) % 7) + n * (n - 1) / 2.0f);
  c.reduce_scatter(full.data(), full.data() + me * k, k, DType::f32);
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(full.get()[me * k + i], part.get()[i]);

  // all_gather, out of place and in place.
  std::vector<int32_t> minev(k);
  for (size_t i = 0; i < k; ++i) minev[i] = me * 100 + static_cast<int32_t>(i);
  Buf<int32_t> mine(c, minev), all(c, n * k, -1);
  c.all_gather(mine.data(), all.data(), k, DType::i32);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(all.get()[j * k + i], j * 100 + static_cast<int32_t>(i));
  std::vector<int32_t> all2v(n * k, -1);
  std::copy(minev.begin(), minev.end(), all2v.begin() + me * k);
  Buf<int32_t> all2(c, all2v);
  c.all_gather(all2.data() + me * k, all2.data(), k, DType::i32);
  EXPECT_EQ(all2.get(), all.get());

  // broadcast from the last rank.
  Buf<int64_t> b(c, k, me);
  c.broadcast(b.data(), b.data(), k, DType::i64, n - 1);
  for (auto v : b.get()) EXPECT_EQ(v, n - 1);

  // all_to_all: block j of rank r holds r*1000 + j*10 + i; rank me receives j*1000 + me*10 + i.
  std::vector<int32_t> sv(n * k);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) sv[j * k + i] = me * 1000 + j * 10 + static_cast<int32_t>(i);
  Buf<int32_t> s(c, sv), r(c, n * k, -1);
  c.all_to_all(s.data(), r.data(), k, DType::i32);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(r.get()[j * k + i], j * 1000 + me * 10 + static_cast<int32_t>(i));
  c.all_to_all(s.data(), s.data(), k, DType::i32);  // in place
  EXPECT_EQ(s.get(), r.get());

  // send/recv around a ring; even ranks send first so nothing depends on eager buffering.
  Buf<int32_t> out(c, {me}), in(c, {-1});
  if (n >= 2) {
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    if (me % 2 == 0) {
      c.send(out.data(), 1, DType::i32, next, 3);
      c.recv(in.data(), 1, DType::i32, prev, 3);
    } else {
      c.recv(in.data(), 1, DType::i32, prev, 3);
      c.send(out.data(), 1, DType::i32, next, 3);
    }
    EXPECT_EQ(in.get()[0], prev);
  }

  EXPECT_EQ(c.host_max(static_cast<double>(me)), n - 1.0);
  EXPECT_EQ(c.host_sum(me + 1), static_cast<int64_t>(n) * (n + 1) / 2);
  EXPECT_THROW(c.send(out.data(), 1, DType::i32, me), Error);  // to itself
  c.barrier();
}

TEST(MpiSelf, EveryOperation) {
  if (!is_mpi_child()) GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.CommunicatorOps";
  Communicator& c = test_support::mpi_self_world();
  ASSERT_GE(c.size(), 2);
  check_every_operation(c);
}

// The MPI backend started without a launcher: a singleton world of one, as NcclWorld starts it;
// also its Works and its 1 × 1 mesh.
TEST(MpiWorldOfOne, SingletonRunsEveryOperation) {
  if (launcher_world_size() > 1) GTEST_SKIP() << "under a launcher of several ranks: MpiSelf.* covers it";
  if (!is_singleton_child()) {
    run_as_singleton_child("MpiWorldOfOne.SingletonRunsEveryOperation");
    return;
  }
  auto c = make_mpi_communicator({.timeout_s = 20});
  ASSERT_EQ(c->size(), 1);
  check_every_operation(*c);
  check_nonblocking(*c);
  check_meshes(*c);
  test_support::check_variable_counts(*c);
}

// The NCCL backend on device buffers: in a world of one (MPI as a singleton), NCCL makes a
// one-rank communicator and every collective runs as NCCL's device-side copy or reduction of one
// input; the Works wait on CUDA events and the 1 × 1 mesh comes from ncclCommSplit. Under mpirun
// on a machine with several GPUs the same test covers n ranks, one GPU each.
TEST(NcclWorld, EveryOperationOnDeviceBuffers) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "this build has no CUDA (the nccl backend is not built)";
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::no_device_reason();
  if (launcher_world_size() <= 1 && !is_singleton_child()) {
    run_as_singleton_child("NcclWorld.EveryOperationOnDeviceBuffers");
    return;
  }
  auto c = make_nccl_communicator({.timeout_s = 60});
  ASSERT_EQ(c->device(), Device::cuda);
  ASSERT_EQ(c->backend(), Backend::nccl);
  EXPECT_EQ(c->size(), launcher_world_size());
  check_every_operation(*c);
  check_nonblocking(*c);
  check_meshes(*c);
  test_support::check_variable_counts(*c);
  if (c->size() == 1) {
    EXPECT_THROW(c->broadcast(nullptr, nullptr, 1, DType::f32, 1), Error);  // root out of range
  }
}

}  // namespace zaya::dist
