// train/context_group: the communicator the model's context-parallel exchanges go over
// (make_context_group: the mesh's cp axis, or a device world split into the mesh's cp groups) and
// the refusal of tensors on a device that communicator cannot carry. Multi-rank exchanges are
// tested through `zaya train` under mpirun (test_context_parallel.cc).
#include <gtest/gtest.h>

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
