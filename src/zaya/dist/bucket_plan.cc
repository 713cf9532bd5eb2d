#include "zaya/dist/bucket_plan.h"

#include <algorithm>

#include "zaya/core/error.h"

namespace zaya::dist {

std::vector<Bucket> plan_buckets(const std::vector<std::pair<int64_t, int64_t>>& report_order, int64_t bucket_elements) {
  ZAYA_CHECK(bucket_elements > 0, "plan_buckets: bucket size must be positive, found ", bucket_elements);
  std::vector<Bucket> buckets;
  Bucket cur;
  bool open = false;
  for (size_t k = 0; k < report_order.size(); ++k) {
    const auto [b, e] = report_order[k];
    if (e == b) continue;
    if (open && e != cur.begin) {
      buckets.push_back(cur);
      open = false;
    }
    if (!open) cur = {b, e, k};
    cur.begin = std::min(cur.begin, b);
    cur.end = std::max(cur.end, e);
    cur.last_report = k;
    open = true;
    if (cur.elements() >= bucket_elements) {
      buckets.push_back(cur);
      open = false;
    }
  }
  if (open) buckets.push_back(cur);
  return buckets;
}

}  // namespace zaya::dist
