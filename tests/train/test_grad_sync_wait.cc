// Who waits for the prefetched parameter gather (GradientSync::need_params): on a device
// communicator the compute stream, with the host returning at once; on a host communicator the
// host. A communicator that records what the sync asks of each collective, rank 0 of 2, stands in
// for NCCL and MPI: no data moves, only the order of starts, stream waits, host waits and tests is
// checked. The values the gather brings and the CPU path's timing are DataParallel.*'s
// (PrefetchedParameterGatherChangesNoBit); the real NCCL stream wait is NcclWorld.*'s and
// ParamGatherWaitNccl.*'s, on a GPU (scripts/gpu_check.sh tests).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator_test_util.h"
#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"
#include "zaya/dist/communicator.h"
#include "zaya/optim/shard_plan.h"
#include "zaya/train/grad_sync.h"

namespace zaya::train {
namespace {

using dist::Work;

// One line per thing asked of a collective: "start gather 0", "device gather 0", "host gather 0",
// "test gather 0" (gathers numbered in issue order, i.e. forward order; buckets likewise).
struct Journal {
  std::vector<std::string> lines;
  bool device = false;    // the collectives are a device backend's
  int fail_gather = -1;   // this gather's host wait throws a timeout naming it
  int count(const std::string& line) const {
    int n = 0;
    for (const std::string& l : lines) n += l == line;
    return n;
  }
  // Index of the first line equal to `line`, or -1.
  int first(const std::string& line) const {
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i] == line) return static_cast<int>(i);
    return -1;
  }
};

class JournalWork final : public Work::Impl {
 public:
  JournalWork(Journal& j, std::string name, bool fail) : j_(j), name_(std::move(name)), fail_(fail) {}
  bool test() override {
    j_.lines.push_back("test " + name_);
    return false;  // still in flight until waited for
  }
  void wait() override {
    j_.lines.push_back("host " + name_);
    if (fail_) throw dist::CollectiveTimeout(name_ + " (all_gather_v) timed out: rank 1 never issued it", {1});
  }
  bool order_compute_stream() override {
    if (!j_.device) return false;
    j_.lines.push_back("device " + name_);
    return true;
  }

 private:
  Journal& j_;
  std::string name_;
  bool fail_;
};

class JournalComm final : public dist::Communicator {
 public:
  explicit JournalComm(Journal& j) : Communicator({}), j_(j) {}
  dist::Backend backend() const override { return j_.device ? dist::Backend::nccl : dist::Backend::mpi; }
  // Host buffers either way: the sync's device-only extras (the stall's CUDA events) stay off.
  Device device() const override { return Device::cpu; }
  int rank() const override { return 0; }
  int size() const override { return 2; }

  Work start_all_gather_v(const void*, void*, std::span<const size_t>, DType) override {
    const int g = gathers_++;
    return issue("gather " + std::to_string(g), g == j_.fail_gather);
  }
  Work start_reduce_scatter_v(const void*, void*, std::span<const size_t>, DType) override {
    return issue("bucket " + std::to_string(buckets_++), false);
  }
  Work start_all_reduce(const void*, void*, size_t, DType) override { return unused("all_reduce"); }
  Work start_reduce_scatter(const void*, void*, size_t, DType) override { return unused("reduce_scatter"); }
  Work start_all_gather(const void*, void*, size_t, DType) override { return unused("all_gather"); }
  Work start_broadcast(const void*, void*, size_t, DType, int) override { return unused("broadcast"); }
  Work start_all_to_all(const void*, void*, size_t, DType) override { return unused("all_to_all"); }
  Work start_barrier() override { return unused("barrier"); }
  Work start_send(const void*, size_t, DType, int, int) override { return unused("send"); }
  Work start_recv(void*, size_t, DType, int, int) override { return unused("recv"); }
  double host_max(double) override { throw Error("JournalComm: host_max is not part of the gradient sync"); }
  int64_t host_sum(int64_t) override { throw Error("JournalComm: host_sum is not part of the gradient sync"); }
  void host_all_gather(const void*, void*, size_t) override {
    throw Error("JournalComm: host_all_gather is not part of the gradient sync");
  }
  std::unique_ptr<Communicator> split(int, int) override { throw Error("JournalComm: split is not part of the gradient sync"); }

 private:
  Work issue(const std::string& name, bool fail) {
    j_.lines.push_back("start " + name);
    return Work(std::make_unique<JournalWork>(j_, name, fail));
  }
  static Work unused(const char* what) { throw Error(str("JournalComm: ", what, " is not part of the gradient sync")); }

  Journal& j_;
  int gathers_ = 0, buckets_ = 0;
};

// Four layers of 10 elements, reported last to first, one bucket each; rank 0 owns [0, 20). The
// gathers go in forward order: gather g holds [10 g, 10 g + 10).
struct Fixture {
  explicit Fixture(bool device) : comm(journal) {
    journal.device = device;
    plan.numel = 40;
    plan.ranks = {{.begin = 0, .end = 20}, {.begin = 20, .end = 40}};
    sync = std::make_unique<GradientSync>(comm, plan, params, grads,
                                          std::vector<std::pair<int64_t, int64_t>>{{30, 40}, {20, 30}, {10, 20}, {0, 10}},
                                          GradReduce::f32, 10);
  }
  // One micro-batch's backward with the step's buckets, then the gradient-sync point.
  void backward_and_finish() {
    auto ready = sync->ready_fn(true);
    for (int64_t b = 30; b >= 0; b -= 10) ready(b, b + 10);
    sync->end_backward(true);
    sync->finish(1);
  }
  Journal journal;
  JournalComm comm;
  optim::ShardPlan plan;
  Tensor params = Tensor::zeros(Shape{40}, DType::f32, Device::cpu);
  Tensor grads = Tensor::zeros(Shape{40}, DType::f32, Device::cpu);
  std::unique_ptr<GradientSync> sync;
};

TEST(ParamGatherWait, DeviceCommunicatorLeavesTheWaitToTheComputeStream) {
  Fixture f(/*device=*/true);
  f.sync->start_param_gather();
  ASSERT_EQ(f.journal.count("start gather 3"), 1);
  f.sync->need_params(0, 15);  // the embedding's and the first layer's: gathers 0 and 1
  EXPECT_EQ(f.journal.count("device gather 0"), 1);
  EXPECT_EQ(f.journal.count("device gather 1"), 1);
  EXPECT_EQ(f.journal.count("device gather 2"), 0);  // not needed yet
  for (int g = 0; g < 4; ++g) EXPECT_EQ(f.journal.count("host gather " + std::to_string(g)), 0) << g;
  EXPECT_TRUE(f.sync->params_pending());
  f.sync->need_params(15, 40);
  EXPECT_FALSE(f.sync->params_pending());  // every bucket is ordered on the stream ...
  EXPECT_EQ(f.journal.count("host gather 3"), 0);
  // ... and the host completes them at the gradient-sync point, before it waits for any bucket.
  f.backward_and_finish();
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(f.journal.count("device gather " + std::to_string(g)), 1) << g;
    EXPECT_EQ(f.journal.count("host gather " + std::to_string(g)), 1) << g;
    EXPECT_LT(f.journal.first("host gather " + std::to_string(g)), f.journal.first("host bucket 0")) << g;
  }
}

TEST(ParamGatherWait, HostCommunicatorWaitsOnTheHostAsBefore) {
  Fixture f(/*device=*/false);
  f.sync->start_param_gather();
  f.sync->need_params(0, 15);
  EXPECT_EQ(f.journal.count("host gather 0"), 1);
  EXPECT_EQ(f.journal.count("host gather 1"), 1);
  EXPECT_EQ(f.journal.count("host gather 2"), 0);
  EXPECT_GE(f.journal.count("test gather 2"), 1);  // MPI moves the later ones on inside its calls
  for (int g = 0; g < 4; ++g) EXPECT_EQ(f.journal.count("device gather " + std::to_string(g)), 0) << g;
  // The backward's start waits for the rest on the host, before any bucket starts.
  auto ready = f.sync->ready_fn(true);
  EXPECT_EQ(f.journal.count("host gather 3"), 1);
  EXPECT_EQ(f.journal.count("start bucket 0"), 0);
  for (int64_t b = 30; b >= 0; b -= 10) ready(b, b + 10);
  f.sync->end_backward(true);
  f.sync->finish(1);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(f.journal.count("host gather " + std::to_string(g)), 1) << g;
}

TEST(ParamGatherWait, SettleCompletesTheDeviceWaitsOnTheHost) {
  Fixture f(/*device=*/true);
  f.sync->start_param_gather();
  f.sync->need_params(0, 40);
  f.sync->settle_params();  // what the trainer does before it hands the model back
  for (int g = 0; g < 4; ++g) EXPECT_EQ(f.journal.count("host gather " + std::to_string(g)), 1) << g;
  // The next update's gather starts from a clean slate: nothing is waited for twice.
  f.sync->start_param_gather();
  EXPECT_EQ(f.journal.count("host gather 0"), 1);
  EXPECT_EQ(f.journal.count("start gather 4"), 1);
}

// A gather that never completes does not stop the host inside the forward (the compute stream
// waits for it), but it is named, as the gather it is, when the host completes it: at the
// gradient-sync point, before the buckets that were issued after it.
TEST(ParamGatherWait, AFailedGatherLeftToTheDeviceIsReportedAtTheSyncPoint) {
  Fixture f(/*device=*/true);
  f.journal.fail_gather = 1;
  f.sync->start_param_gather();
  EXPECT_NO_THROW(f.sync->need_params(0, 40));
  try {
    f.backward_and_finish();
    FAIL() << "finish() returned although gather 1 timed out";
  } catch (const dist::CollectiveTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("gather 1 (all_gather_v) timed out"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.journal.count("host bucket 0"), 0);  // reported before any bucket was waited for
}

TEST(ParamGatherWait, AFailedGatherIsReportedBySettle) {
  Fixture f(/*device=*/true);
  f.journal.fail_gather = 0;
  f.sync->start_param_gather();
  f.sync->need_params(0, 10);
  EXPECT_EQ(f.journal.count("host gather 0"), 0);
  EXPECT_THROW(f.sync->settle_params(), dist::CollectiveTimeout);
  // Named first: the later gathers, which follow it on the communicator's stream, were not waited for.
  EXPECT_EQ(f.journal.count("host gather 1"), 0);
}

// On a GPU, over NCCL in a world of one (MPI as a singleton, in a child process as NcclWorld.*
// starts it): need_params leaves the gather to the compute stream, a copy queued there afterwards
// reads the parameters the gather left (at a world of one, the same values, exactly), the host
// completes the gathers at the sync point, and the compute stream's wait is read from its CUDA
// events. What it cannot show at a world of one is an exposed wait: the gather is a local copy.
TEST(ParamGatherWaitNccl, TheComputeStreamWaitsForTheGatherAndItsWaitIsMeasured) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "this build has no CUDA (the nccl backend is not built)";
  if (cuda::device_count() == 0 || cuda::emulated()) GTEST_SKIP() << "needs a GPU: " << cuda::no_device_reason();
  if (dist::launcher_world_size() <= 1 && !dist::test_support::is_singleton_child()) {
    dist::test_support::run_as_singleton_child("ParamGatherWaitNccl.TheComputeStreamWaitsForTheGatherAndItsWaitIsMeasured");
    return;
  }
  auto comm = dist::make_nccl_communicator({.timeout_s = 60});
  ASSERT_EQ(comm->size(), 1);
  const int64_t P = int64_t{1} << 22, quarter = P / 4;
  std::vector<float> values(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 1000) - 500.0f;
  Tensor params = Tensor::borrow(values.data(), Shape{P}, DType::f32).to(Device::cuda);
  Tensor grads = Tensor::zeros(Shape{P}, DType::f32, Device::cuda);
  Tensor seen = Tensor::zeros(Shape{P}, DType::f32, Device::cuda);
  optim::ShardPlan plan;
  plan.numel = P;
  plan.ranks = {{.begin = 0, .end = P}};
  GradientSync sync(*comm, plan, params, grads,
                    {{3 * quarter, P}, {2 * quarter, 3 * quarter}, {quarter, 2 * quarter}, {0, quarter}},
                    GradReduce::f32, quarter);
  sync.start_param_gather();
  sync.need_params(0, P);
  // The reader: a copy on the compute stream, ordered after the gathers only by their stream waits.
  cuda::current().copy_async(seen.raw(), Device::cuda, params.raw(), Device::cuda, static_cast<size_t>(P) * 4);
  auto ready = sync.ready_fn(true);
  for (int64_t b = 3 * quarter; b >= 0; b -= quarter) ready(b, b + quarter);
  sync.end_backward(true);
  sync.finish(1);
  EXPECT_FALSE(sync.params_pending());
  const Tensor host = seen.to(Device::cpu);
  const float* got = static_cast<const float*>(host.raw());
  for (int64_t i = 0; i < P; i += 997) ASSERT_EQ(got[i], values[static_cast<size_t>(i)]) << "element " << i;
  const SyncTimes& t = sync.times();
  EXPECT_TRUE(std::isfinite(t.gather_exposed_s) && t.gather_exposed_s >= 0) << t.gather_exposed_s;
  EXPECT_LT(t.gather_exposed_s, 10.0);  // a local copy of 16 MiB: anything near the timeout is wrong
  EXPECT_TRUE(std::isfinite(t.gather_s) && t.gather_s >= 0) << t.gather_s;
}

}  // namespace
}  // namespace zaya::train
