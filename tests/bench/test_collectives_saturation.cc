// The collective benchmark's saturation point (what parallel.bucket_mb is derived from): the
// smallest size reaching 90% of the sweep's best out-of-place bus bandwidth, on hand-made sweeps.
#include <gtest/gtest.h>

#include <vector>

#include "zaya/bench/collectives.h"

namespace zaya::bench {
namespace {

std::vector<CollResult> sweep(const std::vector<std::pair<size_t, double>>& size_busbw) {
  std::vector<CollResult> rows;
  for (const auto& [bytes, bw] : size_busbw) {
    CollResult r{};
    r.op = dist::Coll::reduce_scatter;
    r.sizes.bytes = bytes;
    r.busbw[0] = bw;
    r.busbw[1] = 1000;  // in-place columns do not count
    rows.push_back(r);
  }
  return rows;
}

TEST(CollectivesSaturation, SmallestSizeAtNinetyPercentOfTheBest) {
  // A latency-then-bandwidth curve: 10, 50, 85, 95, 100 GB/s.
  EXPECT_EQ(saturation_bytes(sweep({{1024, 10}, {65536, 50}, {1 << 20, 85}, {8 << 20, 95}, {64 << 20, 100}})),
            8u << 20);
  // A dip after saturation (a noisy shared-memory sweep) does not move it.
  EXPECT_EQ(saturation_bytes(sweep({{1024, 10}, {65536, 92}, {1 << 20, 40}, {8 << 20, 100}})), 65536u);
  EXPECT_EQ(saturation_bytes(sweep({{1024, 10}, {65536, 50}}), 0.5), 65536u);
  EXPECT_EQ(saturation_bytes({}), 0u);
  EXPECT_EQ(saturation_bytes(sweep({{1024, 0}})), 0u);
}

}  // namespace
}  // namespace zaya::bench
