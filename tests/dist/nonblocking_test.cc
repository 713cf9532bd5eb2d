// The non-blocking forms (start_<op> returning a Work) on every backend: the local one here, MPI
// as mpirun children with 2 and 3 ranks (MpiSelf.NonBlocking, started by
// MpiIntegration.CommunicatorOps), MPI and NCCL as singleton worlds of one (communicator_test.cc),
// and a Work's timeout diagnosis under mpirun (MpiIntegration.WorkTimeout*).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "communicator_test_util.h"
#include "test_util.h"
#include "zaya/core/cuda_context.h"
#include "zaya/core/dtype.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist {
using test_support::Buf;

namespace {

// Several Works outstanding at once, waited in reverse order of issue, each checked exactly: the
// inputs are small integers, whose sums are exact in f32 and bf16.
void check_outstanding_exact(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const size_t k = 5;  // elements per rank block: odd on purpose
  const float tri = n * (n - 1) / 2.0f;

  // Four reduce_scatter buckets, as gradient buckets issue them; b = 1 and 3 are in place, whose
  // result moves to offset me*k only when the Work completes on MPI.
  std::vector<Buf<float>> bucket, part;
  bucket.reserve(4);
  part.reserve(4);
  for (int b = 0; b < 4; ++b) {
    std::vector<float> v(n * k);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i + b) % 7 + me);
    bucket.emplace_back(c, v);
    part.emplace_back(c, k, -1.0f);
  }
  std::vector<Work> works;
  for (int b = 0; b < 4; ++b) {
    float* recv = b % 2 ? bucket[b].data() + me * k : part[b].data();
    works.push_back(c.start_reduce_scatter(bucket[b].data(), recv, k, DType::f32));
  }
  std::vector<int32_t> minev(k);
  for (size_t i = 0; i < k; ++i) minev[i] = me * 100 + static_cast<int32_t>(i);
  Buf<int32_t> mine(c, minev), all(c, n * k, -1);
  works.push_back(c.start_all_gather(mine.data(), all.data(), k, DType::i32));
  std::vector<bf16> hv(k);
  for (size_t i = 0; i < k; ++i) hv[i] = to_bf16(static_cast<float>(me * 3 + i));
  Buf<bf16> h(c, hv);
  works.push_back(c.start_all_reduce(h.data(), h.data(), k, DType::bf16));
  Buf<int64_t> bc(c, k, me);
  works.push_back(c.start_broadcast(bc.data(), bc.data(), k, DType::i64, n - 1));
  // Two in-place all_to_alls in flight together: each needs its own staging copy of its input.
  std::vector<Buf<int32_t>> a2a;
  for (int m = 0; m < 2; ++m) {
    std::vector<int32_t> sv(n * k);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < k; ++i) sv[j * k + i] = m * 100000 + me * 1000 + j * 10 + static_cast<int32_t>(i);
    a2a.emplace_back(c, sv);
  }
  for (int m = 0; m < 2; ++m) works.push_back(c.start_all_to_all(a2a[m].data(), a2a[m].data(), k, DType::i32));
  works.push_back(c.start_barrier());

  for (auto w = works.rbegin(); w != works.rend(); ++w) w->wait();

  for (int b = 0; b < 4; ++b) {
    const float* got = b % 2 ? bucket[b].get().data() + me * k : part[b].get().data();
    for (size_t i = 0; i < k; ++i)
      EXPECT_EQ(got[i], n * static_cast<float>((me * k + i + b) % 7) + tri) << "bucket " << b << " element " << i;
  }
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(all.get()[j * k + i], j * 100 + static_cast<int32_t>(i));
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(to_float(h.get()[i]), 3.0f * tri + n * static_cast<float>(i));
  for (auto v : bc.get()) EXPECT_EQ(v, n - 1);
  for (int m = 0; m < 2; ++m)
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < k; ++i)
        EXPECT_EQ(a2a[m].get()[j * k + i], m * 100000 + j * 1000 + me * 10 + static_cast<int32_t>(i));
}

// Each collective's result through start_<op> with the others in flight equals the blocking
// call's, bitwise (tolerance 0): the inputs are thirds, so the sums do round, but a collective's
// result depends only on its inputs and on the algorithm the backend picks for its size, not on
// what else is outstanding.
void check_started_equals_blocking(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const size_t k = 37;
  std::vector<float> in(n * k);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(me * 7 + static_cast<int>(i) * 3 + 1) / 3.0f;
  enum { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll, kOps };
  const size_t recv_count[kOps] = {n * k, k, n * k, n * k, n * k};
  auto issue = [&](int op, Buf<float>& s, Buf<float>& r) {
    switch (op) {
      case kAllReduce: return c.start_all_reduce(s.data(), r.data(), n * k, DType::f32);
      case kReduceScatter: return c.start_reduce_scatter(s.data(), r.data(), k, DType::f32);
      case kAllGather: return c.start_all_gather(s.data() + me * k, r.data(), k, DType::f32);
      case kBroadcast: return c.start_broadcast(s.data(), r.data(), n * k, DType::f32, 0);
      default: return c.start_all_to_all(s.data(), r.data(), k, DType::f32);
    }
  };
  std::vector<Buf<float>> send, blocking, started;
  for (int op = 0; op < kOps; ++op) {
    send.emplace_back(c, in);
    blocking.emplace_back(c, recv_count[op], -1.0f);
    started.emplace_back(c, recv_count[op], -2.0f);
  }
  for (int op = 0; op < kOps; ++op) issue(op, send[op], blocking[op]).wait();  // = the blocking call
  std::vector<Work> works;
  for (int op = 0; op < kOps; ++op) works.push_back(issue(op, send[op], started[op]));
  for (int op = kOps - 1; op >= 0; --op) works[op].wait();
  for (int op = 0; op < kOps; ++op) EXPECT_EQ(started[op].get(), blocking[op].get()) << "op " << op;
  // And the blocking forms themselves on a fresh buffer: the same again.
  Buf<float> again(c, n * k, -3.0f);
  c.all_reduce(send[kAllReduce].data(), again.data(), n * k, DType::f32);
  EXPECT_EQ(again.get(), blocking[kAllReduce].get());
}

// test() never blocks and turns true once the collective is complete; waiting after that, or
// testing again, changes nothing.
void check_test_turns_true(Communicator& c) {
  const int n = c.size();
  const size_t count = size_t{1} << 16;  // large enough that it is usually still in flight at first
  Buf<float> x(c, count, 1.0f), y(c, count, 0.0f);
  Work w = c.start_all_reduce(x.data(), y.data(), count, DType::f32);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  long polls = 0;
  while (!w.test()) {
    ++polls;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "test() stayed false for 20 s (" << polls << " polls)";
  }
  EXPECT_TRUE(w.test());
  w.wait();
  for (float v : y.get()) ASSERT_EQ(v, static_cast<float>(n));
}

// Both halves of a ring exchange are posted before either is waited for. On MPI every rank posts
// its receive first, an order that blocking calls cannot use without deadlocking; NCCL runs a
// communicator's operations in issue order on one stream, so there odd ranks receive first and
// even ranks send first, as the blocking check does.
void check_point_to_point(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const bool recv_first = c.backend() != Backend::nccl || me % 2 == 1;
  Buf<int32_t> out(c, {me * 10, me * 10 + 1}), in(c, 2, -1);
  Work r, s;
  if (recv_first) r = c.start_recv(in.data(), 2, DType::i32, prev, 5);
  s = c.start_send(out.data(), 2, DType::i32, next, 5);
  if (!recv_first) r = c.start_recv(in.data(), 2, DType::i32, prev, 5);
  s.wait();
  r.wait();
  EXPECT_EQ(in.get(), (std::vector<int32_t>{prev * 10, prev * 10 + 1}));
}

// A Work dropped without wait() completes in its destructor; an empty or moved-from Work has
// nothing to wait for.
void check_work_lifetime(Communicator& c) {
  const int n = c.size(), me = c.rank();
  Buf<int32_t> x(c, {me + 1}), y(c, {0});
  { Work dropped = c.start_all_reduce(x.data(), y.data(), 1, DType::i32); }
  EXPECT_EQ(y.get()[0], n * (n + 1) / 2);
  Work empty;
  EXPECT_TRUE(empty.test());
  empty.wait();
  Work a = c.start_barrier();
  Work b = std::move(a);
  EXPECT_TRUE(a.test());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  b.wait();
  EXPECT_TRUE(b.test());
}

// The wait of a kernel reader (Work::wait_on_compute_stream): a device backend's operation is left
// to the compute stream (nccl) and the host returns at once; a host backend's is waited for on the
// host. On the device the reader is a device-to-device copy queued on the compute stream right
// after the wait, which only that wait orders after the gather (without it the copy could read the
// receive buffer's fill, -1, though at a world of one the gather is short and such a race need not
// show). Reading the copy back is a host wait on the device, which completes the Work on the host
// first (its errors surface there).
void check_compute_stream_wait(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const size_t k = size_t{1} << 20;
  Buf<float> mine(c, k, static_cast<float>(me + 1)), all(c, n * k, -1.0f), copied(c, n * k, -2.0f);
  Work w = c.start_all_gather(mine.data(), all.data(), k, DType::f32);
  const bool on_device = w.wait_on_compute_stream();
  EXPECT_EQ(on_device, c.backend() == Backend::nccl);
  std::vector<float> got;
  if (on_device) {
    cuda::current().copy_async(copied.data(), Device::cuda, all.data(), Device::cuda, n * k * sizeof(float));
    got = copied.get();
  } else {
    EXPECT_TRUE(w.test());  // complete: the host waited
    got = all.get();
  }
  EXPECT_TRUE(w.test());  // complete on the host by now
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < k; i += 4099) ASSERT_EQ(got[j * k + i], static_cast<float>(j + 1)) << "block " << j << " element " << i;
}

}  // namespace

void test_support::check_nonblocking(Communicator& c) {
  check_outstanding_exact(c);
  check_started_equals_blocking(c);
  check_test_turns_true(c);
  check_point_to_point(c);
  check_work_lifetime(c);
  check_compute_stream_wait(c);
  c.barrier();
}

TEST(LocalCommunicator, WorksCompleteInsideStart) {
  auto c = make_local_communicator();
  std::vector<float> a = {1, 2, 3}, b(3, 0);
  Work w = c->start_all_reduce(a.data(), b.data(), 3, DType::f32);
  EXPECT_EQ(b, a);  // already copied: the local backend finishes inside start_<op>
  EXPECT_TRUE(w.test());
  w.wait();
  EXPECT_THROW((void)c->start_send(a.data(), 1, DType::f32, 0), Error);
  test_support::check_nonblocking(*c);
}

TEST(MpiSelf, NonBlocking) {
  if (!test_support::is_mpi_child()) GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.CommunicatorOps";
  Communicator& c = test_support::mpi_self_world();
  ASSERT_GE(c.size(), 2);
  test_support::check_nonblocking(c);
}

// ---- Timeout: the last rank never issues a collective that the others have started and wait
// for; each of the others must name it. Runs as mpirun children (MpiTimeoutChild.*) of
// MpiIntegration.WorkTimeout*. ----

// The census window is long enough that a survivor descheduled on a loaded machine still reaches
// its own wait (and answers) within it.
constexpr double kShortTimeout = 0.4, kCensus = 1.0;

bool is_timeout_child() { return std::getenv("ZAYA_MPI_TIMEOUT_TEST") != nullptr; }

// What a survivor does once its checks are done. A rank whose communicator broke leaves without
// MPI_Finalize, and mpirun then ends the whole job, so the survivors print their verdict first and
// wait for each other (on a communicator of their own, which is intact) before any of them leaves.
// The late rank never gets to leave by itself: mpirun ends it.
void report_and_meet(Communicator& survivors, int me) {
  std::printf("zaya-checked rank %d: %s\n", me, ::testing::Test::HasFailure() ? "FAILED" : "ok");
  std::fflush(stdout);
  survivors.barrier();
}

// The late rank's nap: far past the others' timeout and census, so mpirun ends it first.
void nap_until_ended() { std::this_thread::sleep_for(std::chrono::seconds(30)); }

TEST(MpiTimeoutChild, WorkNamesTheRankThatNeverIssued) {
  if (!is_timeout_child()) GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.WorkTimeout*";
  auto c = make_mpi_communicator({.timeout_s = 20, .census_s = kCensus});
  const int n = c->size(), me = c->rank(), late = n - 1;
  auto survivors = c->split(me == late ? 1 : 0, me);  // #1 (its barrier) on c
  c->set_timeout(kShortTimeout);
  std::vector<float> x(4, 1.0f), y(4, 0.0f), z(4 * n, 1.0f), zr(4, 0.0f);
  if (me == late) {
    nap_until_ended();  // outside any collective: silent to the census
    return;
  }
  Work first = c->start_reduce_scatter(z.data(), zr.data(), 4, DType::f32);  // #2
  Work second = c->start_all_reduce(x.data(), y.data(), 4, DType::f32);      // #3
  try {
    second.wait();  // waited first, out of issue order
    ADD_FAILURE() << "the all_reduce completed without rank " << late;
  } catch (const CollectiveTimeout& e) {
    std::printf("zaya-timeout rank %d: %s\n", me, e.what());
    EXPECT_EQ(e.missing(), std::vector<int>{late});
    EXPECT_NE(std::string(e.what()).find(str("collective #3 (all_reduce) on rank ", me, " of ", n,
                                             " timed out after ", kShortTimeout, " s: rank ", late, " never arrived")),
              std::string::npos)
        << e.what();
  }
  // The communicator is broken now: the other Work says so instead of waiting again.
  try {
    first.wait();
    ADD_FAILURE() << "a broken communicator completed a wait";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator is broken: collective #3 (all_reduce)"), std::string::npos)
        << e.what();
  }
  report_and_meet(*survivors, me);
}

// The same, but the last rank is inside a wait on another communicator, so it answers the census
// (every live communicator of a process answers while any of them waits) with its latest operation
// on this one, an earlier one: it is named as not having issued the collective, not as silent.
TEST(MpiTimeoutChild, BehindRankIsNamedWithItsLatestCollective) {
  if (!is_timeout_child()) GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.WorkTimeout*";
  // A longer census than the other tests: the late rank answers only once it is inside its wait on
  // `other`, which on loaded cores can take it longer than the short timeout plus one second.
  auto c = make_mpi_communicator({.timeout_s = 20, .census_s = 4 * kCensus});
  auto other = make_mpi_communicator({.timeout_s = 30, .census_s = kCensus});
  const int n = c->size(), me = c->rank(), late = n - 1;
  auto survivors = c->split(me == late ? 1 : 0, me);  // #1 (its barrier) on c
  c->set_timeout(kShortTimeout);
  std::vector<float> x(4, 1.0f), y(4, 0.0f);
  if (me == late) {
    try {
      other->barrier();  // the others never come; mpirun ends this rank before its timeout
    } catch (const Error&) {
    }
    nap_until_ended();
    return;
  }
  try {
    c->all_reduce(x.data(), y.data(), 4, DType::f32);  // #2
    ADD_FAILURE() << "the all_reduce completed without rank " << late;
  } catch (const CollectiveTimeout& e) {
    std::printf("zaya-timeout rank %d: %s\n", me, e.what());
    EXPECT_EQ(e.missing(), std::vector<int>{late});
    EXPECT_NE(std::string(e.what()).find(str("collective #2 (all_reduce) on rank ", me, " of ", n, " timed out after ",
                                             kShortTimeout, " s: rank ", late,
                                             " has not issued it (its latest is collective #1)")),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("never arrived"), std::string::npos) << e.what();
  }
  report_and_meet(*survivors, me);
}

// Runs one MpiTimeoutChild test under mpirun with np ranks and checks that every survivor named
// the late rank (the line `what` starts with) and passed its checks. mpirun's own exit status is
// not looked at: ranks with a broken communicator leave without MPI_Finalize, which it reports.
void expect_survivors_name_the_late_rank(int np, const std::string& test, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun r = test::run_shell(test_support::mpirun(np, "-x ZAYA_MPI_TIMEOUT_TEST=1") +
                                         test_support::self_exe() + " --gtest_filter=MpiTimeoutChild." + test +
                                         " --gtest_brief=1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int survivor = 0; survivor < np - 1; ++survivor) {
    EXPECT_NE(r.output.find(str("zaya-timeout rank ", survivor, ": ", what, " on rank ", survivor, " of ", np)),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(str("zaya-checked rank ", survivor, ": ok")), std::string::npos) << r.output;
  }
  // The timeout and census, not the late rank's 30 s nap, set the pace; generous for shared cores.
  EXPECT_LT(seconds, 15) << r.output;
}

TEST(MpiIntegration, WorkTimeoutNamesTheRankThatNeverIssued) {
  for (int np : {2, 3}) expect_survivors_name_the_late_rank(np, "WorkNamesTheRankThatNeverIssued", "collective #3 (all_reduce)");
}

TEST(MpiIntegration, WorkTimeoutNamesARankInAnotherCommunicatorAsBehind) {
  expect_survivors_name_the_late_rank(3, "BehindRankIsNamedWithItsLatestCollective", "collective #2 (all_reduce)");
}

}  // namespace zaya::dist
