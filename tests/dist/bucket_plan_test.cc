// Gradient buckets from a backward's report order: adjacent reports grouped up to the bucket size,
// a non-adjacent report closing the bucket, empty reports skipped, every element in one bucket.
#include <gtest/gtest.h>

#include "zaya/core/error.h"
#include "zaya/dist/bucket_plan.h"

namespace zaya::dist {
namespace {

TEST(BucketPlan, GroupsAdjacentReportsUpToTheSize) {
  // A backward's order: the norm [90, 100), layers [60, 90) [30, 60) [10, 30), the embedding [0, 10).
  const std::vector<std::pair<int64_t, int64_t>> order{{90, 100}, {60, 90}, {30, 60}, {10, 30}, {0, 10}};
  const std::vector<Bucket> b = plan_buckets(order, 35);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].begin, 60);  // norm + last layer = 40 >= 35
  EXPECT_EQ(b[0].end, 100);
  EXPECT_EQ(b[0].last_report, 1u);
  EXPECT_EQ(b[1].begin, 10);  // 30 + 20 = 50
  EXPECT_EQ(b[1].last_report, 3u);
  EXPECT_EQ(b[2].begin, 0);  // the rest, closed at the end
  EXPECT_EQ(b[2].end, 10);
  // One element per bucket: every report its own bucket.
  EXPECT_EQ(plan_buckets(order, 1).size(), order.size());
  // Larger than everything: one bucket.
  EXPECT_EQ(plan_buckets(order, 1000).size(), 1u);
}

TEST(BucketPlan, NonAdjacentReportClosesAndEmptyOnesAreSkipped) {
  const std::vector<std::pair<int64_t, int64_t>> order{{20, 30}, {5, 5}, {0, 10}, {10, 20}};
  const std::vector<Bucket> b = plan_buckets(order, 100);
  ASSERT_EQ(b.size(), 3u);  // [20,30) then [0,10) is not adjacent to it, then [10,20) not adjacent to [0,10)'s start
  EXPECT_EQ(b[0].begin, 20);
  EXPECT_EQ(b[1].begin, 0);
  EXPECT_EQ(b[1].last_report, 2u);
  EXPECT_EQ(b[2].begin, 10);
  EXPECT_THROW(plan_buckets(order, 0), Error);
}

}  // namespace
}  // namespace zaya::dist
