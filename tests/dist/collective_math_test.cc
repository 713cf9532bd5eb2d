// The nccl-tests arithmetic: per-rank counts, bus factors, size parsing and sweeps.
#include <gtest/gtest.h>

#include "zaya/core/error.h"
#include "zaya/dist/collective_math.h"

namespace zaya::dist {
namespace {

TEST(CollSizes, AllReduceAndBroadcastKeepTheWholeCount) {
  for (Coll c : {Coll::all_reduce, Coll::broadcast}) {
    CollSizes s = coll_sizes(c, 1000, 4, 3);
    EXPECT_EQ(s.count, 250u);
    EXPECT_EQ(s.send_count, 250u);
    EXPECT_EQ(s.recv_count, 250u);
    EXPECT_EQ(s.bytes, 1000u);
  }
}

TEST(CollSizes, SplittingOpsRoundDownToAMultipleOfTheRankCount) {
  // 1000 B of bf16 = 500 elements over 3 ranks: 166 per rank, 498 in the whole array, as
  // nccl-tests' GetCollByteCount gives (count/nranks, then times nranks).
  CollSizes rs = coll_sizes(Coll::reduce_scatter, 1000, 2, 3);
  EXPECT_EQ(rs.count, 166u);
  EXPECT_EQ(rs.send_count, 498u);
  EXPECT_EQ(rs.recv_count, 166u);
  EXPECT_EQ(rs.bytes, 996u);  // the size column is the whole array
  CollSizes ag = coll_sizes(Coll::all_gather, 1000, 2, 3);
  EXPECT_EQ(ag.count, 166u);
  EXPECT_EQ(ag.send_count, 166u);
  EXPECT_EQ(ag.recv_count, 498u);
  EXPECT_EQ(ag.bytes, 996u);
  CollSizes a2a = coll_sizes(Coll::all_to_all, 1000, 2, 3);
  EXPECT_EQ(a2a.count, 166u);  // per peer; S = count * n * type size
  EXPECT_EQ(a2a.send_count, 498u);
  EXPECT_EQ(a2a.recv_count, 498u);
  EXPECT_EQ(a2a.bytes, 166u * 3 * 2);
  // The _v forms run with equal counts: their fixed-count form's sizes and bus factor.
  for (Coll v : {Coll::reduce_scatter_v, Coll::all_gather_v}) {
    const CollSizes z = coll_sizes(v, 1000, 2, 3), f = coll_sizes(fixed_count_form(v), 1000, 2, 3);
    EXPECT_EQ(z.count, f.count);
    EXPECT_EQ(z.send_count, f.send_count);
    EXPECT_EQ(z.recv_count, f.recv_count);
    EXPECT_EQ(z.bytes, f.bytes);
    EXPECT_DOUBLE_EQ(bus_factor(v, 4), 0.75);
  }
  EXPECT_EQ(fixed_count_form(Coll::reduce_scatter_v), Coll::reduce_scatter);
  EXPECT_EQ(fixed_count_form(Coll::all_gather_v), Coll::all_gather);
  EXPECT_EQ(fixed_count_form(Coll::broadcast), Coll::broadcast);
}

TEST(CollSizes, TooSmallForTheRanksGivesZeroCount) {
  CollSizes s = coll_sizes(Coll::all_gather, 8, 4, 4);  // 2 floats over 4 ranks
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_EQ(coll_sizes(Coll::all_reduce, 7, 4, 2).count, 1u);  // a partial element is dropped
}

TEST(BusFactor, MatchesNcclTests) {
  // Exact: small ratios of integers, computed once in double.
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_reduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::reduce_scatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_gather, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_reduce, 1), 0.0);
}

TEST(ParseSize, SuffixesArePowersOf1024) {
  EXPECT_EQ(parse_size("8", "-b"), 8u);
  EXPECT_EQ(parse_size("64K", "-b"), 65536u);
  EXPECT_EQ(parse_size("64M", "-e"), 64u << 20);
  EXPECT_EQ(parse_size("1g", "-e"), 1u << 30);
  EXPECT_EQ(parse_size("1.5K", "-e"), 1536u);
  EXPECT_EQ(parse_size("1000", "-e"), 1000u);
}

TEST(ParseSize, RejectsGarbageNamingTheFlag) {
  for (const char* bad : {"64Q", "", "-5", "abc", "1e400", "12KB"}) {
    try {
      parse_size(bad, "-e");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("-e"), std::string::npos) << e.what();
    }
  }
}

TEST(Sweep, FactorAndStep) {
  EXPECT_EQ(sweep_sizes(8, 1024, 4, 0), (std::vector<uint64_t>{8, 32, 128, 512}));
  EXPECT_EQ(sweep_sizes(1000, 3000, 1, 1000), (std::vector<uint64_t>{1000, 2000, 3000}));
  EXPECT_EQ(sweep_sizes(5, 5, 2, 0), (std::vector<uint64_t>{5}));
  EXPECT_EQ(sweep_sizes(0, 100, 2, 0).size(), 1u);  // never grows: stop instead of looping
}

TEST(ParseColls, NamesAndAll) {
  EXPECT_EQ(parse_colls("all").size(), 7u);
  EXPECT_EQ(parse_colls("all_to_all"), (std::vector<Coll>{Coll::all_to_all}));
  EXPECT_EQ(parse_colls("reduce_scatter_v"), (std::vector<Coll>{Coll::reduce_scatter_v}));
  EXPECT_THROW(parse_colls("allreduce"), Error);
}

TEST(FormatTime, NcclTestsPrecisionSteps) {
  EXPECT_EQ(format_time_us(3.14159), "   3.14");
  EXPECT_EQ(format_time_us(123.456), "  123.5");
  EXPECT_EQ(format_time_us(12345.6), "  12346");
}

}  // namespace
}  // namespace zaya::dist
