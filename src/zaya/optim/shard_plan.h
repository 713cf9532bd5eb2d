// The ZeRO-1 shard plan: which contiguous range of the flat parameter buffer each data-parallel
// rank owns (its fp32 master elements, gradient shard and optimizer state), and so which rank owns
// each Muon matrix.
//
// One contiguous range per rank, in rank order, covering the buffer exactly once. Contiguity is
// what makes the collectives free of packing: a gradient bucket (a contiguous slice of the buffer
// that backward has finished) is reduce-scattered in place, each rank receiving the slice's
// intersection with its range, and the updated parameters are all-gathered in place.
//
// Where a range may end:
//   - between parameters;
//   - inside an AdamW parameter only between rows of its leading dimension, so that every rank's
//     part of every parameter and state tensor is a hyper-rectangle (a checkpoint chunk);
//   - inside a Muon expert stack [E, r, c] only between experts, and never inside a Muon matrix:
//     Newton–Schulz needs the whole matrix, so each Muon matrix has exactly one owner — the rank
//     whose range holds it — which keeps its momentum and orthogonalizes it whole.
//
// The cuts balance optimizer-state bytes (AdamW 8 B per element, Muon 4 B): ZeRO-1's point is
// memory. Each cut is the allowed position nearest to its ideal k/N share, so a rank's state is
// within one row or one Muon matrix of 1/N. Newton–Schulz FLOPs then follow the layout (the
// embedding, all AdamW, sits at the front); the plan reports both imbalances and
// docs/data-parallel.md discusses them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/optim/config.h"
#include "zaya/optim/param_table.h"

namespace zaya::optim {

struct RankShare {
  int64_t begin = 0, end = 0;  // the range [begin, end) of the flat buffers
  int64_t state_bytes = 0;     // AdamW m, v and Muon momentum of the range
  int64_t muon_matrices = 0;   // Muon matrices owned (each expert's separately)
  double ns_flops = 0;         // Newton–Schulz FLOPs per step of those matrices
  int64_t elements() const { return end - begin; }
};

struct ShardPlan {
  int64_t numel = 0;
  std::vector<RankShare> ranks;

  ShardRange range(int rank) const { return {ranks.at(static_cast<size_t>(rank)).begin, ranks.at(static_cast<size_t>(rank)).end}; }
  int owner_of(int64_t element) const;  // the rank whose range holds element (0 <= element < numel)
  // max / mean over ranks (1 = perfectly balanced; 0 when the total is zero).
  double state_imbalance() const;
  double ns_imbalance() const;
  // Lines for the start-up summary: the ranges, state per rank, Muon matrices and FLOPs per rank.
  std::string str() const;
  // Throws naming the first violation: ranges out of order, overlapping, leaving a gap, not ending
  // at numel, or cutting a Muon matrix or an AdamW row of `table`.
  void validate(const std::vector<model::ParamSpec>& specs, const std::vector<int64_t>& offsets,
                const OptimizerConfig& config) const;
};

// Newton–Schulz FLOPs of one r×c matrix per step (X·Xᵀ, A·A, B·X with r ≤ c, per iteration).
double newton_schulz_flops(int64_t rows, int64_t cols);

// The plan for `world` ranks over the parameters `specs` at `offsets` (a ParamTable's). A world
// larger than the number of indivisible pieces leaves some ranks an empty range.
ShardPlan plan_shards(const std::vector<model::ParamSpec>& specs, const std::vector<int64_t>& offsets,
                      const OptimizerConfig& config, int world);
inline ShardPlan plan_shards(const ParamTable& table, const OptimizerConfig& config, int world) {
  return plan_shards(table.specs, table.offsets, config, world);
}

}  // namespace zaya::optim
