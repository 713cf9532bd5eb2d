// Work::wait_on_compute_stream with recording Work implementations: a device operation is left to
// the compute stream and the host returns at once, a host one is waited for on the host, and a Work
// left to the device is completed on the host at the next host wait on the device (a copy), where
// its error surfaces. The real device backend's half (NCCL's stream wait) is
// check_compute_stream_wait in nonblocking_test.cc, which NcclWorld.* runs on a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "zaya/core/cuda_runtime.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist {
namespace {

// What the host did with an operation: how often it was ordered on the device, waited, tested.
struct Calls {
  int orders = 0, waits = 0, tests = 0;
  bool complete = false;
};

// An operation of a device backend (`device`: order_compute_stream succeeds) or of a host one.
// `fail` makes its host wait throw what a communicator's timeout throws.
class RecordingWork final : public Work::Impl {
 public:
  RecordingWork(Calls& calls, bool device, bool fail = false) : calls_(calls), device_(device), fail_(fail) {}
  bool test() override {
    ++calls_.tests;
    return calls_.complete;
  }
  void wait() override {
    ++calls_.waits;
    if (fail_) throw CollectiveTimeout("all_gather_v (collective #7) timed out after 1 s: rank 1 never issued it", {1});
    calls_.complete = true;
  }
  bool order_compute_stream() override {
    ++calls_.orders;
    return device_;
  }

 private:
  Calls& calls_;
  bool device_, fail_;
};

Work recording(Calls& calls, bool device, bool fail = false) {
  return Work(std::make_unique<RecordingWork>(calls, device, fail));
}

// A host wait on the device: cuda::copy between two host buffers (a memcpy on the emulated
// device, which this turns on where no GPU is; a host-to-host cudaMemcpy on a GPU).
class HostWaitOnTheDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) {
      cuda::set_emulated(true);
      emulating_ = true;
    }
  }
  void TearDown() override {
    if (emulating_) cuda::set_emulated(false);  // the other tests of this binary expect no device
  }
  void host_wait() {
    float a = 1, b = 0;
    cuda::copy(&b, Device::cpu, &a, Device::cpu, sizeof a);
  }
  bool emulating_ = false;
};

TEST(WaitOnComputeStream, HostWorkIsWaitedForOnTheHost) {
  Calls c;
  Work w = recording(c, /*device=*/false);
  EXPECT_FALSE(w.wait_on_compute_stream());
  EXPECT_EQ(c.orders, 1);
  EXPECT_EQ(c.waits, 1);
  EXPECT_TRUE(w.test());
  EXPECT_EQ(c.tests, 0);  // complete since the wait: nothing left to ask
}

TEST(WaitOnComputeStream, DeviceWorkIsLeftToTheDeviceAndStaysPending) {
  Calls c;
  Work w = recording(c, /*device=*/true);
  EXPECT_TRUE(w.wait_on_compute_stream());
  EXPECT_EQ(c.orders, 1);
  EXPECT_EQ(c.waits, 0);                    // the host returned at once
  EXPECT_TRUE(w.wait_on_compute_stream());  // once ordered, not again
  EXPECT_EQ(c.orders, 1);
  EXPECT_FALSE(w.test());  // still pending on the host
  w.wait();
  EXPECT_EQ(c.waits, 1);
  EXPECT_TRUE(w.test());
}

TEST(WaitOnComputeStream, CompleteWorkHasNothingToOrder) {
  Work done;  // what the local backend returns
  EXPECT_FALSE(done.wait_on_compute_stream());
}

TEST_F(HostWaitOnTheDevice, CompletesTheWorksLeftToTheDeviceFirst) {
  Calls first, second, host;
  Work a = recording(first, true), b = recording(second, true), h = recording(host, false);
  ASSERT_TRUE(a.wait_on_compute_stream());
  ASSERT_TRUE(b.wait_on_compute_stream());
  ASSERT_FALSE(h.wait_on_compute_stream());
  host_wait();
  EXPECT_EQ(first.waits, 1);
  EXPECT_EQ(second.waits, 1);
  EXPECT_EQ(host.waits, 1);  // waited once, in wait_on_compute_stream, never by the hook
  host_wait();               // nothing is left to complete
  EXPECT_EQ(first.waits, 1);
  EXPECT_EQ(second.waits, 1);
  EXPECT_TRUE(a.test());
  EXPECT_TRUE(b.test());
}

TEST_F(HostWaitOnTheDevice, ReportsTheFailureOfAWorkLeftToTheDevice) {
  Calls c;
  Work w = recording(c, true, /*fail=*/true);
  ASSERT_TRUE(w.wait_on_compute_stream());  // a hung collective: the host does not notice here
  try {
    host_wait();
    FAIL() << "the host wait returned although the collective it depends on timed out";
  } catch (const CollectiveTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather_v (collective #7)"), std::string::npos) << e.what();
    EXPECT_EQ(e.missing(), std::vector<int>{1});
  }
  host_wait();  // reported once: the next host wait does not repeat it
  EXPECT_EQ(c.waits, 1);
  EXPECT_THROW(w.wait(), CollectiveTimeout);  // the Work itself still is not complete
}

TEST_F(HostWaitOnTheDevice, ForgetsADestroyedWorkAndFollowsAMovedOne) {
  Calls gone, moved;
  {
    Work w = recording(gone, true);
    ASSERT_TRUE(w.wait_on_compute_stream());
  }  // destroyed pending: its Impl is gone, the hook must not reach it
  Work kept;
  {
    Work w = recording(moved, true);
    ASSERT_TRUE(w.wait_on_compute_stream());
    kept = std::move(w);
  }
  host_wait();
  EXPECT_EQ(gone.waits, 0);
  EXPECT_EQ(moved.waits, 1);
  EXPECT_TRUE(kept.test());
  // Assigning over a Work left to the device drops it from the list too.
  Calls over;
  Work x = recording(over, true);
  ASSERT_TRUE(x.wait_on_compute_stream());
  x = Work();
  host_wait();
  EXPECT_EQ(over.waits, 0);
}

}  // namespace
}  // namespace zaya::dist
