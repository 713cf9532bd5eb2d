// The process mesh: the world's ranks arranged as dp × cp, each axis a sub-communicator.
//
// Layout: cp is the fastest-varying axis, so world rank = dp_rank · cp + cp_rank. A cp group (the
// ranks that share one sequence) is cp consecutive world ranks, which a launcher places on one
// node when cp divides the ranks per node: the halo and K/V traffic of context parallelism stays on
// the fastest links. A dp group (the ranks that hold the same sequence chunk of different samples
// and reduce gradients together) is every cp-th world rank from cp_rank.
//
//   world 6, dp 3 × cp 2:   cp groups {0,1} {2,3} {4,5};   dp groups {0,2,4} {1,3,5}
//
// The sub-communicators are made by Communicator::split on the world's backend (MPI_Comm_split,
// ncclCommSplit, or a local world of one), so they take device buffers exactly when the world does.
#pragma once

#include <memory>

#include "zaya/dist/communicator.h"

namespace zaya::dist {

class Mesh {
 public:
  // Collective over `world`, which must outlive the mesh. Throws zaya::Error naming the sizes when
  // dp or cp is not positive or dp · cp is not the world size (before any communication, so every
  // rank throws), and when ranks disagree on the shape.
  Mesh(Communicator& world, int dp, int cp);

  int dp_size() const { return dp_size_; }
  int cp_size() const { return cp_size_; }
  int dp_rank() const { return dp_rank_; }
  int cp_rank() const { return cp_rank_; }

  Communicator& world() { return world_; }
  Communicator& dp() { return *dp_; }  // this rank's dp group, ranked by dp_rank
  Communicator& cp() { return *cp_; }  // this rank's cp group, ranked by cp_rank

  // The world rank at (dp_rank, cp_rank) of a dp × cp mesh.
  static int world_rank(int dp_rank, int cp_rank, int cp) { return dp_rank * cp + cp_rank; }

 private:
  Communicator& world_;
  int dp_size_, cp_size_, dp_rank_, cp_rank_;
  std::unique_ptr<Communicator> dp_, cp_;
};

}  // namespace zaya::dist
