// train/context_group: the communicator the model's context-parallel exchanges go over
// (make_context_group: the mesh's cp axis, or a device world split into the mesh's cp groups) and
// the refusal of tensors on a device that communicator cannot carry; the non-blocking forms
// (start_all_gather, start_reduce_scatter) over the local communicator and over MPI as two ranks of
// mpirun. Training under cp is tested through `zaya train` under mpirun (test_context_parallel.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/dist/mesh.h"
#include "zaya/train/context_group.h"

namespace zaya::train {
namespace {

Tensor counting(int64_t n, float base) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = base + static_cast<float>(i);
  return t;
}

TEST(ContextGroup, OverTheMeshOrADeviceWorldSplitLikeIt) {
  auto world = dist::make_local_communicator();
  dist::Mesh mesh(*world, 1, 1);
  auto device_world = dist::make_local_communicator();
  for (dist::Communicator* device : {static_cast<dist::Communicator*>(nullptr), device_world.get()}) {
    SCOPED_TRACE(device ? "a device world" : "the mesh");
    const auto group = make_context_group(mesh, device);
    EXPECT_EQ(group->rank(), mesh.cp_rank());
    EXPECT_EQ(group->size(), mesh.cp_size());
    const Tensor send = counting(5, 1), recv = counting(5, 100), sum = counting(5, 100);
    group->all_gather(recv, send);
    group->reduce_scatter(sum, send);
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(recv.data<float>()[i], 1.0f + static_cast<float>(i));
      EXPECT_EQ(sum.data<float>()[i], 1.0f + static_cast<float>(i));
    }
    EXPECT_EQ(group->calls(), 2);
    EXPECT_EQ(group->bytes_sent(), 0.0);  // a group of one sends nothing
  }
}

// The start forms over a group of one (the local communicator completes inside start): the
// Exchange is complete, and the counters count it.
TEST(ContextGroup, StartFormsOverTheLocalCommunicator) {
  auto world = dist::make_local_communicator();
  dist::Mesh mesh(*world, 1, 1);
  const auto group = make_context_group(mesh, nullptr);
  const Tensor send = counting(3, 7), recv = counting(3, 0), sum = counting(3, 0);
  model::Exchange a = group->start_all_gather(recv, send), b = group->start_reduce_scatter(sum, send);
  EXPECT_TRUE(a.test());
  a.wait();
  b.wait();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(recv.data<float>()[i], 7.0f + static_cast<float>(i));
    EXPECT_EQ(sum.data<float>()[i], 7.0f + static_cast<float>(i));
  }
  EXPECT_EQ(group->calls(), 2);
  EXPECT_GE(group->blocked_seconds(), 0.0);
  group->reset_counters();
  EXPECT_EQ(group->blocked_seconds(), 0.0);
}

// As a rank of `mpirun -np 2` (started by ContextGroup.StartFormsOverMpiAsTwoRanks): a gather and a
// reduce-scatter in flight together over the mesh's cp axis (dp 1 × cp 2), polled with test()
// until both complete (MPI's non-blocking collectives progress inside MPI calls), the send buffers
// untouched meanwhile; then the same through the blocking forms.
TEST(ContextGroupMpiRank, StartFormsInFlightTogether) {
  if (!std::getenv("ZAYA_CP_GROUP_RANK")) GTEST_SKIP() << "runs only as a rank of ContextGroup.StartFormsOverMpiAsTwoRanks";
  auto world = dist::make_mpi_communicator({.timeout_s = 20});
  dist::Mesh mesh(*world, 1, 2);
  const auto group = make_context_group(mesh, nullptr);
  const int r = group->rank();
  constexpr int64_t n = 1000;  // past OpenMPI's eager limit for shared memory: a real rendezvous
  const Tensor send = counting(n, static_cast<float>(10 * r)), recv = counting(2 * n, -1);
  const Tensor send2 = counting(2 * n, static_cast<float>(r)), sum = counting(n, -1);
  model::Exchange a = group->start_all_gather(recv, send), b = group->start_reduce_scatter(sum, send2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(a.test() && b.test()) && std::chrono::steady_clock::now() < deadline) {
  }
  EXPECT_TRUE(a.test() && b.test()) << "the exchanges did not complete under test() polls in 20 s";
  a.wait();
  b.wait();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(recv.data<float>()[i], static_cast<float>(i)) << i;
    ASSERT_EQ(recv.data<float>()[n + i], 10.0f + static_cast<float>(i)) << i;
    // rank 0's and rank 1's send2[r·n + i]: (0 + r·n + i) + (1 + r·n + i)
    ASSERT_EQ(sum.data<float>()[i], 1.0f + 2.0f * static_cast<float>(r * n + i)) << i;
  }
  const Tensor again = counting(2 * n, -1);
  group->all_gather(again, send);
  for (int64_t i = 0; i < 2 * n; ++i) ASSERT_EQ(again.data<float>()[i], recv.data<float>()[i]) << i;
  EXPECT_EQ(group->calls(), 3);
  EXPECT_EQ(group->bytes_sent(), 4.0 * (n + n + n));  // (cp − 1)/cp of each 2n-float buffer
}

TEST(ContextGroup, StartFormsOverMpiAsTwoRanks) {
  const test::CliRun run = test::run_shell(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 -x ZAYA_CP_GROUP_RANK=1 " +
      std::filesystem::read_symlink("/proc/self/exe").string() +
      " --gtest_filter=ContextGroupMpiRank.* --gtest_brief=1");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_EQ(run.output.find("SKIPPED"), std::string::npos) << run.output;
}

// A host communicator handed device tensors would read device memory on the host: refused, naming
// both sides. The emulated device's "device" tensors are host memory, which it may carry.
TEST(ContextGroup, TensorsOnADeviceTheCommunicatorCannotCarryAreRefused) {
  const bool was_emulated = cuda::emulated();
  cuda::set_emulated(false);
  auto world = dist::make_local_communicator();
  dist::Mesh mesh(*world, 1, 1);
  const auto group = make_context_group(mesh, nullptr);
  const Tensor host_send = counting(4, 1), host_recv = counting(4, 0);
  const Tensor send = Tensor::borrow(host_send.raw(), host_send.shape(), DType::f32, Device::cuda);
  const Tensor recv = Tensor::borrow(host_recv.raw(), host_recv.shape(), DType::f32, Device::cuda);
  const std::string gather = test::error_of([&] { group->all_gather(recv, send); });
  EXPECT_NE(gather.find("context-parallel all-gather: the tensors are on cuda"), std::string::npos) << gather;
  EXPECT_NE(gather.find("the cp communicator (local) takes cpu buffers"), std::string::npos) << gather;
  const std::string reduce = test::error_of([&] { group->reduce_scatter(host_recv, send); });
  EXPECT_NE(reduce.find("context-parallel reduce-scatter: the tensors are on cuda"), std::string::npos) << reduce;
  if (cuda::device_count() == 0) {
    cuda::set_emulated(true);
    group->all_gather(recv, send);
    EXPECT_EQ(host_recv.data<float>()[3], 4.0f);
  }
  cuda::set_emulated(was_emulated);
}

}  // namespace
}  // namespace zaya::train
