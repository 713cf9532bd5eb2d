#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "zaya/core/error.h"
#include "zaya/sizing/cluster_sim.h"

namespace zaya::sizing {
namespace {

// Relative tolerance for closed-form comparisons: the simulator evaluates the same formula in a
// different order, so only double rounding (~1e-16 per operation, a few dozen operations) differs.
constexpr double kExact = 1e-12;

ClusterSpec one_node(int gpus, double gbs, double lat_us) {
  ClusterSpec c;
  c.nodes = 1;
  c.gpus_per_node = gpus;
  c.intra_gbs = gbs;
  c.intra_latency_us = lat_us;
  return c;
}

TEST(ClusterSim, RingAllReduceMatchesTheAnalyticalFormulaOnAUniformTopology) {
  for (int n : {2, 3, 4, 8, 16}) {
    const ClusterSpec c = one_node(n, 100, 3);
    const double alpha = 3e-6, B = 100e9;
    for (double S : {1024.0, 1e6, 1.5e9}) {
      const double want = 2.0 * (n - 1) * (alpha + S / (n * B));
      EXPECT_NEAR(*collective_time(c, SimColl::all_reduce, SimAlgo::ring, S), want, kExact * want) << n << " " << S;
      const double half = (n - 1) * (alpha + S / (n * B));
      EXPECT_NEAR(*collective_time(c, SimColl::reduce_scatter, SimAlgo::ring, S), half, kExact * half);
      EXPECT_NEAR(*collective_time(c, SimColl::all_gather, SimAlgo::ring, S), half, kExact * half);
    }
  }
}

TEST(ClusterSim, HierarchicalEqualsTheRingOnOneNode) {
  const ClusterSpec c = one_node(8, 450, 1);
  for (double S : {4096.0, 1e8}) {
    const double ring = *collective_time(c, SimColl::all_reduce, SimAlgo::ring, S);
    EXPECT_NEAR(*collective_time(c, SimColl::all_reduce, SimAlgo::hierarchical, S), ring, kExact * ring);
  }
}

TEST(ClusterSim, HierarchicalBeatsTheFlatRingAcrossNodesWhenIntraIsMuchFasterThanInter) {
  ClusterSpec c;
  c.nodes = 16;
  c.gpus_per_node = 8;
  c.intra_gbs = 900;  // intra ≫ inter: 8 NICs x 25 Gb/s = 25 GB/s per node
  c.nic_gbps = 25;
  c.nic_latency_us = 5;
  for (double S : {64e3, 1e6, 16e6}) {
    const double ring = *collective_time(c, SimColl::all_reduce, SimAlgo::ring, S);
    const double hier = *collective_time(c, SimColl::all_reduce, SimAlgo::hierarchical, S);
    EXPECT_LT(hier, ring) << S;
  }
}

TEST(ClusterSim, TreeWinsSmallMessagesAtScaleAndRingWinsLargeOnesOnFewNodes) {
  ClusterSpec c;
  c.nodes = 128;
  const double small = 1024, large = 1e9;
  // Ring latency grows with 2(n-1) steps, the tree's with its depth.
  EXPECT_LT(*collective_time(c, SimColl::all_reduce, SimAlgo::tree, small),
            *collective_time(c, SimColl::all_reduce, SimAlgo::ring, small));
  // Bandwidth: the ring moves 2(n-1)/n · S per rank, the tree 2 · S.
  c.nodes = 2;
  EXPECT_LT(*collective_time(c, SimColl::all_reduce, SimAlgo::ring, large),
            *collective_time(c, SimColl::all_reduce, SimAlgo::tree, large));
  EXPECT_FALSE(collective_time(c, SimColl::reduce_scatter, SimAlgo::tree, small).has_value());
}

TEST(ClusterSim, RailsOnlyCostsAllToAllMoreThanFatTreeButNotTheRing) {
  ClusterSpec rails;
  rails.nodes = 4;
  rails.intra_gbs = 50;  // slow intra fabric makes the extra cross-rail hop visible
  ClusterSpec fat = rails;
  fat.topology = Topology::fat_tree;
  fat.switch_latency_us = 0;  // same latency: only the routing differs
  const double S = 64e6;
  EXPECT_GT(*collective_time(rails, SimColl::all_to_all, SimAlgo::ring, S),
            *collective_time(fat, SimColl::all_to_all, SimAlgo::ring, S));
  EXPECT_DOUBLE_EQ(*collective_time(rails, SimColl::all_reduce, SimAlgo::ring, S),
                   *collective_time(fat, SimColl::all_reduce, SimAlgo::ring, S));
}

TEST(ClusterSim, BestAlgorithmIsTheFastestAvailable) {
  ClusterSpec c;
  c.nodes = 8;
  for (const auto& r : simulate_sweep(c, SimColl::all_reduce, {8, 1e4, 1e6, 1e8, 1e9}))
    for (const auto& t : r.time_s)
      if (t) {
        EXPECT_LE(r.best_time_s(), *t);
      }
}

TEST(ClusterSim, CalibrationRecoversAlphaAndBetaFromSyntheticData) {
  const double alpha = 17e-6, beta = 1.0 / 3.3e9;
  std::vector<double> x, y;
  for (double s = 1024; s <= 1 << 28; s *= 4) x.push_back(s), y.push_back(alpha + s * beta);
  const LinearFit f = fit_alpha_beta(x, y);
  // Exact data: the fit is exact up to rounding in sums over sizes spanning 5 decades.
  EXPECT_NEAR(f.alpha_s, alpha, 1e-9 * alpha);
  EXPECT_NEAR(f.beta_s_per_byte, beta, 1e-9 * beta);

  // Through the CSV and the hop model: a 4-rank ring all_reduce with known hop α and B is
  // recovered, and predicts the 2-rank ring with the same hop exactly.
  const double hop_a = 2e-6, hop_b = 5e9;
  const std::string path = ::testing::TempDir() + "/zaya_sim_calib.csv";
  {
    std::ofstream out(path);
    out << "op,ranks,size_bytes,count,type,redop,root,oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,ip_time_us,"
           "ip_algbw_gbs,ip_busbw_gbs,ip_wrong\n";
    for (double s = 8; s <= 1 << 26; s *= 2) {
      const double t = 2.0 * 3 * (hop_a + s / (4 * hop_b));
      out << "all_reduce,4," << static_cast<long long>(s) << ",0,float,sum,-1," << t * 1e6 << ",0,0,0,0,0,0,0\n";
    }
    out << "all_reduce,4,0,0,float,sum,-1,0.2,0,0,0,0,0,0,0\n";  // nccl-tests' 0-byte rows are skipped
  }
  const auto cals = calibrate(read_collectives_csv(path), 0);
  ASSERT_EQ(cals.size(), 1u);
  // The CSV stores times with 6 significant digits: relative error up to ~1e-6.
  EXPECT_NEAR(cals[0].hop.alpha_s, hop_a, 1e-5 * hop_a);
  EXPECT_NEAR(cals[0].hop.bytes_per_s, hop_b, 1e-5 * hop_b);
  const double S = 1 << 24, want2 = 2.0 * 1 * (hop_a + S / (2 * hop_b));
  EXPECT_NEAR(calibrated_time(cals[0], 2, S), want2, 1e-5 * want2);
}

TEST(ClusterSim, BadInputsAreNamed) {
  ClusterSpec c;
  c.nodes = 0;
  try {
    c.validate();
    FAIL() << "nodes = 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().field, "--nodes");
  }
  EXPECT_THROW(parse_topology("torus", "--topology"), Error);
  EXPECT_THROW(parse_sim_coll("allreduce", "--op"), Error);
  const std::string path = ::testing::TempDir() + "/zaya_sim_bad.csv";
  std::ofstream(path) << "op,ranks,size\nall_reduce,2,8\n";
  EXPECT_THROW(read_collectives_csv(path), Error);
  EXPECT_THROW(read_collectives_csv(path + ".missing"), Error);
}

}  // namespace
}  // namespace zaya::sizing
