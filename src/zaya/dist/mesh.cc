#include "zaya/dist/mesh.h"

#include <vector>

namespace zaya::dist {
namespace {

// Validates the shape (before any member that divides by cp) and returns cp.
int checked_shape(Communicator& world, int dp, int cp) {
  if (dp <= 0 || cp <= 0)
    throw Error(str("process mesh: dp and cp must be positive, found dp = ", dp, ", cp = ", cp));
  if (static_cast<long long>(dp) * cp != world.size())
    throw Error(str("process mesh: dp × cp = ", dp, " × ", cp, " = ", static_cast<long long>(dp) * cp,
                    " ranks, but the world has ", world.size()));
  return cp;
}

}  // namespace

Mesh::Mesh(Communicator& world, int dp, int cp)
    : world_(world),
      dp_size_(dp),
      cp_size_(checked_shape(world, dp, cp)),
      dp_rank_(world.rank() / cp),
      cp_rank_(world.rank() % cp) {
  // Every rank must build the same mesh; a rank that asks for another shape would otherwise pair
  // up with the wrong ranks in the splits below.
  const int32_t mine[2] = {dp, cp};
  std::vector<int32_t> all(2 * static_cast<size_t>(world.size()));
  world.host_all_gather(mine, all.data(), sizeof mine);
  for (int r = 0; r < world.size(); ++r)
    if (all[2 * r] != dp || all[2 * r + 1] != cp)
      throw Error(str("process mesh: rank ", world.rank(), " asked for dp × cp = ", dp, " × ", cp, " but rank ", r,
                      " for ", all[2 * r], " × ", all[2 * r + 1]));
  // Same color: same group. The dp group of a rank shares its cp_rank and is ordered by dp_rank;
  // the cp group shares its dp_rank and is ordered by cp_rank.
  dp_ = world.split(/*color=*/cp_rank_, /*key=*/dp_rank_);
  cp_ = world.split(/*color=*/dp_rank_, /*key=*/cp_rank_);
}

}  // namespace zaya::dist
