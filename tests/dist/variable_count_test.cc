// The variable-count collectives (reduce_scatter_v, all_gather_v) on every backend: the local one
// here, MPI as mpirun children with 2 and 3 ranks (MpiSelf.VariableCounts, started by
// MpiIntegration.CommunicatorOps) and as a singleton, NCCL where a GPU is (communicator_test.cc),
// and a _v Work's timeout diagnosis under mpirun (MpiIntegration.VariableCountTimeout*).
//
// Every expected value is exact, so every comparison has tolerance 0: f32 and bf16 inputs are
// small integers (their sums stay below 256, where bf16 holds every integer), and f64 inputs carry a
// 2^-30 part that f32 would drop, so an f64 reduction done in f32 anywhere fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "communicator_test_util.h"
#include "test_util.h"
#include "zaya/core/dtype.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist {
using test_support::Buf;

namespace {

// Element i of rank q's input.
double input(int q, size_t i, DType t) {
  const double whole = static_cast<double>((q * 7 + static_cast<int>(i) * 3) % 11 + q);
  return t == DType::f64 ? whole + (q + 1) * std::ldexp(1.0, -30) : whole;
}
double sum_over_ranks(int n, size_t i, DType t) {
  double s = 0;
  for (int q = 0; q < n; ++q) s += input(q, i, t);
  return s;
}

template <class T>
T as(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
double back(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return to_float(v);
  else
    return static_cast<double>(v);
}

size_t sum(const std::vector<size_t>& v, size_t end) {
  size_t s = 0;
  for (size_t r = 0; r < end; ++r) s += v[r];
  return s;
}

// The trainer's use. A flat buffer of 23 elements; rank r owns [own[r], own[r+1]) (uneven ranges);
// buckets are consecutive slices of 4, 7, 1 and 11 elements, and a bucket's counts are its
// intersections with the owned ranges, so most of them are 0. Every bucket is reduce-scattered in
// place, all outstanding together and waited in reverse order; each rank's owned range then holds
// the sum. Then every bucket is all-gathered in place the same way, and every rank holds the sum
// everywhere.
template <class T>
void check_buckets_in_place(Communicator& c) {
  const DType t = dtype_of<T>::value;
  const int n = c.size(), me = c.rank();
  const size_t total = 23;
  std::vector<size_t> own(n + 1);
  for (int r = 0; r <= n; ++r) own[r] = total * r * r / (n * n);
  const std::vector<size_t> edges = {0, 4, 11, 12, 23};
  std::vector<T> gv(total);
  for (size_t i = 0; i < total; ++i) gv[i] = as<T>(input(me, i, t));
  Buf<T> grad(c, gv);

  std::vector<std::vector<size_t>> counts;
  for (size_t b = 0; b + 1 < edges.size(); ++b) {
    std::vector<size_t> k(n);
    for (int r = 0; r < n; ++r) {
      const size_t lo = std::max(edges[b], own[r]), hi = std::min(edges[b + 1], own[r + 1]);
      k[r] = hi > lo ? hi - lo : 0;
    }
    counts.push_back(k);
  }
  auto mine = [&](size_t b) { return std::clamp(own[me], edges[b], edges[b + 1]); };  // where my block starts
  std::vector<Work> works;
  for (size_t b = 0; b < counts.size(); ++b)
    works.push_back(c.start_reduce_scatter_v(grad.data() + edges[b], grad.data() + mine(b), counts[b], t));
  for (auto w = works.rbegin(); w != works.rend(); ++w) w->wait();
  for (size_t i = own[me]; i < own[me + 1]; ++i)
    EXPECT_EQ(back(grad.get()[i]), sum_over_ranks(n, i, t)) << dtype_name(t) << " owned element " << i;

  works.clear();
  for (size_t b = 0; b < counts.size(); ++b)
    works.push_back(c.start_all_gather_v(grad.data() + mine(b), grad.data() + edges[b], counts[b], t));
  for (auto w = works.rbegin(); w != works.rend(); ++w) w->wait();
  for (size_t i = 0; i < total; ++i)
    EXPECT_EQ(back(grad.get()[i]), sum_over_ranks(n, i, t)) << dtype_name(t) << " gathered element " << i;
}

// Out of place, with counts that are uneven and 0 for some ranks. A rank whose block is empty keeps
// its recv (reduce_scatter_v) untouched; all_gather_v writes exactly sum(counts) elements.
template <class T>
void check_out_of_place(Communicator& c, const std::vector<size_t>& counts) {
  const DType t = dtype_of<T>::value;
  const int n = c.size(), me = c.rank();
  const size_t total = sum(counts, n), before = sum(counts, me), k = counts[me];
  const T sentinel = as<T>(-5.0);
  std::vector<T> sv(total);
  for (size_t i = 0; i < total; ++i) sv[i] = as<T>(input(me, i, t));
  Buf<T> send(c, sv), part(c, k + 1, sentinel);
  c.reduce_scatter_v(send.data(), part.data(), counts, t);
  for (size_t i = 0; i < k; ++i)
    EXPECT_EQ(back(part.get()[i]), sum_over_ranks(n, before + i, t)) << dtype_name(t) << " element " << i;
  EXPECT_EQ(back(part.get()[k]), -5.0) << "reduce_scatter_v wrote past its block of " << k;

  std::vector<T> minev(k + 1);
  for (size_t i = 0; i < k; ++i) minev[i] = as<T>(input(me, before + i, t));
  Buf<T> block(c, minev), all(c, total + 1, sentinel);
  c.all_gather_v(block.data(), all.data(), counts, t);
  for (int q = 0, at = 0; q < n; at += static_cast<int>(counts[q]), ++q)
    for (size_t i = 0; i < counts[q]; ++i)
      EXPECT_EQ(back(all.get()[at + i]), input(q, at + i, t))
          << dtype_name(t) << " block " << q << " element " << i;
  EXPECT_EQ(back(all.get()[total]), -5.0) << "all_gather_v wrote past sum(counts) = " << total;
}

}  // namespace

void test_support::check_variable_counts(Communicator& c) {
  const int n = c.size();
  check_buckets_in_place<float>(c);
  check_buckets_in_place<bf16>(c);
  check_buckets_in_place<double>(c);
  // Uneven, with a 0 on every other rank (rank 0 always has a block).
  std::vector<size_t> uneven(n);
  for (int r = 0; r < n; ++r) uneven[r] = r % 2 ? 0 : 2 * r + 3;
  // One rank's block only (a bucket inside one rank's range), here the last rank's.
  std::vector<size_t> last_only(n, 0);
  last_only[n - 1] = 6;
  const std::vector<size_t> all_empty(n, 0);
  for (const auto& counts : {uneven, last_only, all_empty}) {
    check_out_of_place<float>(c, counts);
    check_out_of_place<bf16>(c, counts);
    check_out_of_place<double>(c, counts);
  }

  // f64 in the fixed-count collectives too.
  std::vector<double> xv(5);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = input(c.rank(), i, DType::f64);
  Buf<double> x(c, xv);
  c.all_reduce(x.data(), x.data(), xv.size(), DType::f64);
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(x.get()[i], sum_over_ranks(n, i, DType::f64)) << i;

  // One count per rank, checked on every rank before anything is issued (so every rank throws).
  const std::vector<size_t> wrong_length(n + 1, 1);
  EXPECT_THROW(c.reduce_scatter_v(x.data(), x.data(), wrong_length, DType::f64), Error);
  EXPECT_THROW(c.all_gather_v(x.data(), x.data(), wrong_length, DType::f64), Error);
  c.barrier();
}

TEST(LocalCommunicator, VariableCounts) {
  auto c = make_local_communicator();
  test_support::check_variable_counts(*c);
  // A world of one: the single block is the whole buffer.
  std::vector<float> a = {1, 2, 3}, b(3, 0);
  const std::vector<size_t> counts = {3};
  c->reduce_scatter_v(a.data(), b.data(), counts, DType::f32);
  EXPECT_EQ(b, a);
  try {
    c->all_gather_v(a.data(), b.data(), std::vector<size_t>{1, 2}, DType::f32);
    ADD_FAILURE() << "two counts in a world of one were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather_v: expected one count per rank (1), found 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(MpiSelf, VariableCounts) {
  if (!test_support::is_mpi_child())
    GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.CommunicatorOps";
  Communicator& c = test_support::mpi_self_world();
  ASSERT_GE(c.size(), 2);
  test_support::check_variable_counts(c);
}

// ---- Timeout: the last rank never issues a reduce_scatter_v whose counts give it no block (a
// bucket outside its range); the others must still wait for it and name it, and the all_gather_v
// already in flight must then report the broken communicator. ----

bool is_v_timeout_child() { return std::getenv("ZAYA_MPI_V_TIMEOUT_TEST") != nullptr; }

TEST(MpiVariableCountTimeoutChild, NamesTheRankThatNeverIssued) {
  if (!is_v_timeout_child())
    GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.VariableCountTimeout*";
  auto c = make_mpi_communicator({.timeout_s = 20, .census_s = 1.0});
  const int n = c->size(), me = c->rank(), late = n - 1;
  auto survivors = c->split(me == late ? 1 : 0, me);  // #1 (its barrier) on c
  c->set_timeout(0.4);
  if (me == late) {
    std::this_thread::sleep_for(std::chrono::seconds(30));  // silent to the census; mpirun ends it
    return;
  }
  std::vector<size_t> counts(n, 2);
  counts[late] = 0;
  std::vector<float> buf(2 * n, 1.0f), out(2 * n, 0.0f);
  Work gather = c->start_all_gather_v(buf.data(), out.data(), counts, DType::f32);               // #2
  Work reduce = c->start_reduce_scatter_v(buf.data(), buf.data() + 2 * me, counts, DType::f32);  // #3
  try {
    reduce.wait();
    ADD_FAILURE() << "the reduce_scatter_v completed without rank " << late;
  } catch (const CollectiveTimeout& e) {
    std::printf("zaya-timeout rank %d: %s\n", me, e.what());
    EXPECT_EQ(e.missing(), std::vector<int>{late});
    EXPECT_NE(std::string(e.what()).find(str("collective #3 (reduce_scatter_v) on rank ", me, " of ", n,
                                             " timed out after 0.4 s: rank ", late, " never arrived")),
              std::string::npos)
        << e.what();
  }
  try {
    gather.wait();
    ADD_FAILURE() << "a broken communicator completed a wait";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator is broken: collective #3 (reduce_scatter_v)"),
              std::string::npos)
        << e.what();
  }
  std::printf("zaya-checked rank %d: %s\n", me, ::testing::Test::HasFailure() ? "FAILED" : "ok");
  std::fflush(stdout);
  survivors->barrier();
}

TEST(MpiIntegration, VariableCountTimeoutNamesTheRankThatNeverIssued) {
  const int np = 3;
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliRun r =
      test::run_shell(test_support::mpirun(np, "-x ZAYA_MPI_V_TIMEOUT_TEST=1") + test_support::self_exe() +
                      " --gtest_filter=MpiVariableCountTimeoutChild.* --gtest_brief=1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int survivor = 0; survivor < np - 1; ++survivor) {
    EXPECT_NE(r.output.find(str("zaya-timeout rank ", survivor, ": collective #3 (reduce_scatter_v) on rank ",
                                survivor, " of ", np)),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(str("zaya-checked rank ", survivor, ": ok")), std::string::npos) << r.output;
  }
  // The timeout and census, not the late rank's 30 s nap, set the pace; generous for shared cores.
  EXPECT_LT(seconds, 15) << r.output;
}

}  // namespace zaya::dist
