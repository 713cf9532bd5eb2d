#include "zaya/train/context_group.h"

#include <chrono>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"

namespace zaya::train {

namespace {
// The communicator's buffers must live where the tensors do; the emulated device's "device"
// tensors are host memory, which a host communicator carries.
void check_device(const char* what, const dist::Communicator& comm, const Tensor& t) {
  if (t.device() == comm.device() || (t.device() == Device::cuda && cuda::emulated())) return;
  throw Error(str("context-parallel ", what, ": the tensors are on ", device_name(t.device()), " (", t.str(),
                  "), but the cp communicator (", dist::backend_name(comm.backend()), ") takes ",
                  device_name(comm.device()), " buffers"));
}
}  // namespace

// The Work of one exchange; its start and wait time counts as blocked.
class CommContextGroup::Pending final : public model::Exchange::Impl {
 public:
  Pending(dist::Work work, double& blocked_s) : work_(std::move(work)), blocked_s_(blocked_s) {}
  bool test() override { return work_.test(); }
  void wait() override {
    const auto t0 = std::chrono::steady_clock::now();
    work_.wait();
    blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  dist::Work work_;
  double& blocked_s_;
};

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

model::Exchange CommContextGroup::start_all_gather(const Tensor& recv, const Tensor& send) {
  const int64_t n = send.numel(), k = comm_.size();
  ZAYA_CHECK(send.dtype() == DType::f32 && recv.dtype() == DType::f32 && recv.numel() == n * k,
             "context-parallel all-gather: expected f32 send [n] and recv [", k, " x n], found ", send.str(),
             " and ", recv.str());
  check_device("all-gather", comm_, send);
  check_device("all-gather", comm_, recv);
  const auto t0 = std::chrono::steady_clock::now();
  dist::Work work = comm_.start_all_gather(send.raw(), recv.raw(), static_cast<size_t>(n), DType::f32);
  blocked_s_ += seconds_since(t0);
  bytes_ += 4.0 * static_cast<double>(n * (k - 1));
  ++calls_;
  return model::Exchange(std::make_unique<Pending>(std::move(work), blocked_s_));
}

model::Exchange CommContextGroup::start_reduce_scatter(const Tensor& recv, const Tensor& send) {
  const int64_t n = recv.numel(), k = comm_.size();
  ZAYA_CHECK(send.dtype() == DType::f32 && recv.dtype() == DType::f32 && send.numel() == n * k,
             "context-parallel reduce-scatter: expected f32 send [", k, " x n] and recv [n], found ",
             send.str(), " and ", recv.str());
  check_device("reduce-scatter", comm_, send);
  check_device("reduce-scatter", comm_, recv);
  const auto t0 = std::chrono::steady_clock::now();
  dist::Work work = comm_.start_reduce_scatter(send.raw(), recv.raw(), static_cast<size_t>(n), DType::f32);
  blocked_s_ += seconds_since(t0);
  bytes_ += 4.0 * static_cast<double>(n * (k - 1));
  ++calls_;
  return model::Exchange(std::make_unique<Pending>(std::move(work), blocked_s_));
}

std::unique_ptr<CommContextGroup> make_context_group(dist::Mesh& mesh, dist::Communicator* device_world) {
  if (!device_world) return std::make_unique<CommContextGroup>(mesh.cp());
  ZAYA_CHECK(device_world->size() == mesh.world().size() && device_world->rank() == mesh.world().rank(),
             "context parallelism: the device world (rank ", device_world->rank(), " of ", device_world->size(),
             ") is not the mesh's world (rank ", mesh.world().rank(), " of ", mesh.world().size(), ")");
  // The mesh's own split (dist/mesh.h): a cp group is the ranks of one dp rank, ordered by cp rank.
  std::unique_ptr<dist::Communicator> cp = device_world->split(/*color=*/mesh.dp_rank(), /*key=*/mesh.cp_rank());
  ZAYA_CHECK(cp->size() == mesh.cp_size() && cp->rank() == mesh.cp_rank(), "context parallelism: the device cp group ",
             "made rank ", cp->rank(), " of ", cp->size(), " where the mesh has rank ", mesh.cp_rank(), " of ",
             mesh.cp_size());
  return std::make_unique<CommContextGroup>(std::move(cp));
}

}  // namespace zaya::train
