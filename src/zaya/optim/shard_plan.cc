#include "zaya/optim/shard_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "zaya/core/error.h"
#include "zaya/optim/grouping.h"

namespace zaya::optim {
namespace {

// How a parameter may be cut and what its elements cost in state.
struct Piece {
  int64_t unit = 1;         // elements per indivisible piece: a leading-dimension row, or a Muon matrix
  int64_t bytes_per = 8;    // optimizer-state bytes per element: AdamW m + v, or Muon momentum
  bool muon = false;
  int64_t rows = 0, cols = 0;  // the Muon matrix shape
};

Piece piece_of(const model::ParamSpec& spec, const OptimizerConfig& config) {
  const ParamGroup g = group_of(spec, config);
  Piece p;
  const int64_t n = spec.shape.numel();
  if (g.group == Group::muon) {
    p.muon = true;
    p.unit = g.rows * g.cols;
    p.bytes_per = 4;
    p.rows = g.rows;
    p.cols = g.cols;
  } else {
    p.unit = spec.shape.ndim() >= 1 && spec.shape[0] > 0 ? n / spec.shape[0] : n;
  }
  p.unit = std::max<int64_t>(p.unit, 1);
  return p;
}

}  // namespace

double newton_schulz_flops(int64_t rows, int64_t cols) {
  const double r = static_cast<double>(std::min(rows, cols)), c = static_cast<double>(std::max(rows, cols));
  return 4.0 * r * r * c + 2.0 * r * r * r;
}

ShardPlan plan_shards(const std::vector<model::ParamSpec>& specs, const std::vector<int64_t>& offsets,
                      const OptimizerConfig& config, int world) {
  ZAYA_CHECK(world >= 1, "shard plan: the world size must be positive, found ", world);
  ZAYA_CHECK(specs.size() == offsets.size(), "shard plan: ", specs.size(), " parameters but ", offsets.size(),
             " offsets");
  ShardPlan plan;
  std::vector<Piece> pieces;
  double total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    pieces.push_back(piece_of(specs[i], config));
    total += static_cast<double>(specs[i].shape.numel() * pieces.back().bytes_per);
    plan.numel = std::max(plan.numel, offsets[i] + specs[i].shape.numel());
  }
  // Cut k (k = 1..world-1) at the allowed position whose cumulative state is nearest k/world of
  // the total. Targets and parameters are both in buffer order, so one pass places every cut.
  std::vector<int64_t> cuts;
  double before = 0;  // state bytes of the parameters before parameter i
  size_t i = 0;
  for (int k = 1; k < world; ++k) {
    const double target = total * k / world;
    while (i < specs.size() && before + static_cast<double>(specs[i].shape.numel() * pieces[i].bytes_per) < target) {
      before += static_cast<double>(specs[i].shape.numel() * pieces[i].bytes_per);
      ++i;
    }
    int64_t cut = plan.numel;
    if (i < specs.size()) {
      const Piece& p = pieces[i];
      const int64_t units = specs[i].shape.numel() / p.unit;
      const double per_unit = static_cast<double>(p.unit * p.bytes_per);
      const int64_t j = std::clamp<int64_t>(std::llround((target - before) / per_unit), 0, units);
      cut = offsets[i] + j * p.unit;
    }
    if (!cuts.empty()) cut = std::max(cut, cuts.back());
    cuts.push_back(cut);
  }
  int64_t begin = 0;
  for (int r = 0; r < world; ++r) {
    RankShare s;
    s.begin = begin;
    s.end = r + 1 < world ? cuts[static_cast<size_t>(r)] : plan.numel;
    begin = s.end;
    plan.ranks.push_back(s);
  }
  // What each rank holds: state bytes element by element (a range may end inside an AdamW
  // parameter), Muon matrices by their first element.
  for (size_t q = 0; q < specs.size(); ++q) {
    const Piece& p = pieces[q];
    const int64_t off = offsets[q], n = specs[q].shape.numel();
    for (RankShare& s : plan.ranks) {
      const int64_t lo = std::max(off, s.begin), hi = std::min(off + n, s.end);
      if (hi > lo) s.state_bytes += (hi - lo) * p.bytes_per;
    }
    if (!p.muon) continue;
    for (int64_t m = 0; m < n / p.unit; ++m) {
      RankShare& s = plan.ranks[static_cast<size_t>(plan.owner_of(off + m * p.unit))];
      ++s.muon_matrices;
      s.ns_flops += newton_schulz_flops(p.rows, p.cols);
    }
  }
  plan.validate(specs, offsets, config);
  return plan;
}

int ShardPlan::owner_of(int64_t element) const {
  ZAYA_CHECK(element >= 0 && element < numel, "shard plan: element ", element, " is outside the buffer of ", numel);
  // Ranges are sorted; empty ones never hold an element.
  auto it = std::upper_bound(ranks.begin(), ranks.end(), element,
                             [](int64_t e, const RankShare& s) { return e < s.end; });
  return static_cast<int>(it - ranks.begin());
}

namespace {
template <class F> double imbalance(const std::vector<RankShare>& ranks, F value) {
  double sum = 0, max = 0;
  for (const RankShare& s : ranks) {
    sum += value(s);
    max = std::max(max, value(s));
  }
  return sum > 0 ? max / (sum / static_cast<double>(ranks.size())) : 0.0;
}
}  // namespace

double ShardPlan::state_imbalance() const {
  return imbalance(ranks, [](const RankShare& s) { return static_cast<double>(s.state_bytes); });
}
double ShardPlan::ns_imbalance() const {
  return imbalance(ranks, [](const RankShare& s) { return s.ns_flops; });
}

std::string ShardPlan::str() const {
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line,
                "ZeRO-1 shards over %zu ranks: optimizer state max/mean %.3f, Newton-Schulz FLOPs max/mean %.3f",
                ranks.size(), state_imbalance(), ns_imbalance());
  out += line;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankShare& s = ranks[r];
    std::snprintf(line, sizeof line,
                  "\n  rank %zu: elements [%lld, %lld), state %.2f MiB, %lld Muon matrices, %.3g NS FLOP/iteration", r,
                  static_cast<long long>(s.begin), static_cast<long long>(s.end), s.state_bytes / 1048576.0,
                  static_cast<long long>(s.muon_matrices), s.ns_flops);
    out += line;
  }
  return out;
}

void ShardPlan::validate(const std::vector<model::ParamSpec>& specs, const std::vector<int64_t>& offsets,
                         const OptimizerConfig& config) const {
  ZAYA_CHECK(!ranks.empty(), "shard plan: no ranks");
  int64_t at = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankShare& s = ranks[r];
    ZAYA_CHECK(s.begin == at && s.end >= s.begin, "shard plan: rank ", r, "'s range [", s.begin, ", ", s.end,
               ") does not start where rank ", r == 0 ? std::string("-") : zaya::str(r - 1), "'s ends (", at, ")");
    at = s.end;
  }
  ZAYA_CHECK(at == numel, "shard plan: the ranges end at ", at, ", not at the buffer's end ", numel);
  for (size_t q = 0; q < specs.size(); ++q) {
    const Piece p = piece_of(specs[q], config);
    const int64_t off = offsets[q], n = specs[q].shape.numel();
    for (size_t r = 0; r + 1 < ranks.size(); ++r) {
      const int64_t cut = ranks[r].end;
      if (cut <= off || cut >= off + n) continue;
      ZAYA_CHECK((cut - off) % p.unit == 0, "shard plan: the cut at element ", cut, " between ranks ", r, " and ",
                 r + 1, " falls inside ", p.muon ? "a Muon matrix of " : "a row of ", specs[q].name,
                 " (pieces of ", p.unit, " elements from ", off, ")");
    }
  }
}

}  // namespace zaya::optim
