#include "zaya/sizing/cluster_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/sizing/model_gemms.h"

namespace zaya::sizing {

const char* sim_coll_name(SimColl c) {
  switch (c) {
    case SimColl::all_reduce: return "all_reduce";
    case SimColl::reduce_scatter: return "reduce_scatter";
    case SimColl::all_gather: return "all_gather";
    case SimColl::broadcast: return "broadcast";
    case SimColl::all_to_all: return "all_to_all";
  }
  return "?";
}

const char* sim_algo_name(SimAlgo a) {
  switch (a) {
    case SimAlgo::ring: return "ring";
    case SimAlgo::tree: return "tree";
    case SimAlgo::hierarchical: return "hierarchical";
  }
  return "?";
}

SimColl parse_sim_coll(const std::string& name, const std::string& flag) {
  for (SimColl c : kSimColls)
    if (name == sim_coll_name(c)) return c;
  throw Error("unknown collective", {.field = flag, .expected = "all_reduce, reduce_scatter, all_gather, broadcast or all_to_all",
                                     .found = name});
}

Topology parse_topology(const std::string& name, const std::string& flag) {
  if (name == "rails-only") return Topology::rails_only;
  if (name == "fat-tree") return Topology::fat_tree;
  throw Error("unknown topology", {.field = flag, .expected = "rails-only or fat-tree", .found = name});
}

double sim_bus_factor(SimColl c, int n) {
  const double dn = n;
  switch (c) {
    case SimColl::all_reduce: return 2.0 * (dn - 1) / dn;
    case SimColl::broadcast: return 1.0;
    default: return (dn - 1) / dn;
  }
}

void ClusterSpec::validate() const {
  auto positive = [](bool ok, const char* flag, double v, const char* what) {
    if (!ok) throw Error("invalid value", {.field = flag, .expected = what, .found = str(v)});
  };
  positive(nodes >= 1, "--nodes", nodes, "at least 1");
  positive(gpus_per_node >= 1, "--gpus-per-node", gpus_per_node, "at least 1");
  positive(nics_per_node >= 1, "--nics-per-node", nics_per_node, "at least 1");
  positive(nic_gbps > 0, "--nic-gbps", nic_gbps, "a positive Gbit/s");
  positive(intra_gbs > 0, "--intra-gbps", intra_gbs, "a positive GB/s");
  positive(intra_latency_us >= 0, "--intra-latency-us", intra_latency_us, "0 or more");
  positive(nic_latency_us >= 0, "--latency-us", nic_latency_us, "0 or more");
  positive(switch_latency_us >= 0, "--switch-latency-us", switch_latency_us, "0 or more");
  positive(static_cast<double>(nodes) * gpus_per_node <= 1 << 20, "--nodes", nodes, "at most 2^20 GPUs in all");
}

Hop intra_hop(const ClusterSpec& c) { return {c.intra_latency_us * 1e-6, c.intra_gbs * 1e9}; }

Hop inter_hop(const ClusterSpec& c, int senders_per_node, bool cross_rail) {
  const double node_bw = c.nics_per_node * c.nic_gbps * 1e9 / 8.0;
  Hop h{c.nic_latency_us * 1e-6, node_bw / std::max(1, senders_per_node)};
  // Fat-tree: leaf, spine, leaf (two switches more than a rail switch); rails-only: one switch.
  if (c.topology == Topology::fat_tree) h.alpha_s += 2 * c.switch_latency_us * 1e-6;
  if (cross_rail && c.topology == Topology::rails_only) {
    // Off-rail data first moves to the GPU on the destination rail over the intra fabric.
    Hop in = intra_hop(c);
    h.alpha_s += in.alpha_s;
    h.bytes_per_s = std::min(h.bytes_per_s, in.bytes_per_s);
  }
  return h;
}

namespace {

// One synchronous step on a flat ring over all ranks (node-major order): G-1 of every G hops are
// intra-node, one is inter-node on a rail whose channels stripe over all of the node's NICs.
double ring_step(const ClusterSpec& c, double bytes) {
  double t = 0;
  if (c.gpus_per_node > 1) t = intra_hop(c).cost(bytes);
  if (c.nodes > 1) t = std::max(t, inter_hop(c, 1, false).cost(bytes));
  return t;
}

// A chain of `depth` hops carrying `bytes`, pipelined in k chunks: (depth + k - 1) steps of the
// slowest hop; k chosen (powers of two) to minimise the time.
template <class StepCost>
double pipelined(int depth, double bytes, StepCost step) {
  if (depth <= 0) return 0;
  double best = 1e300;
  for (double k = 1; k <= (1 << 20) && bytes / k >= 1.0; k *= 2)
    best = std::min(best, (depth + k - 1) * step(bytes / k));
  return best == 1e300 ? depth * step(bytes) : best;
}

int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

double all_to_all_pairwise(const ClusterSpec& c, double bytes) {
  const int n = c.ranks(), G = c.gpus_per_node;
  const double chunk = bytes / n;
  double t = 0;
  for (int r = 1; r < n; ++r) {
    int off_node = 0;
    for (int g = 0; g < G; ++g) off_node += ((g + r) % n) >= G;  // node 0's GPUs whose peer is elsewhere
    double step = 0;
    if (off_node < G) step = intra_hop(c).cost(chunk);
    if (off_node > 0) step = std::max(step, inter_hop(c, off_node, r % G != 0).cost(chunk));
    t += step;
  }
  return t;
}

}  // namespace

std::optional<double> collective_time(const ClusterSpec& c, SimColl op, SimAlgo algo, double S) {
  const int n = c.ranks(), G = c.gpus_per_node, N = c.nodes;
  if (n == 1) return 0.0;
  const Hop in = intra_hop(c);
  const Hop rail = inter_hop(c, G, false);  // every GPU of a node sends on its own rail at once
  switch (algo) {
    case SimAlgo::ring:
      switch (op) {
        case SimColl::all_reduce: return 2.0 * (n - 1) * ring_step(c, S / n);
        case SimColl::reduce_scatter:
        case SimColl::all_gather: return (n - 1) * ring_step(c, S / n);
        case SimColl::broadcast: return pipelined(n - 1, S, [&](double b) { return ring_step(c, b); });
        case SimColl::all_to_all: return all_to_all_pairwise(c, S);
      }
      break;
    case SimAlgo::tree: {
      // NCCL-style: a chain inside each node, a binary tree across nodes; all_reduce is a
      // pipelined reduce up and broadcast down.
      if (op != SimColl::all_reduce && op != SimColl::broadcast) return std::nullopt;
      const int intra_depth = G - 1, inter_depth = ceil_log2(N);
      const Hop up = inter_hop(c, 1, false);
      auto step = [&](double b) {
        double t = intra_depth > 0 ? in.cost(b) : 0;
        return inter_depth > 0 ? std::max(t, up.cost(b)) : t;
      };
      const double one = pipelined(intra_depth + inter_depth, S, step);
      return op == SimColl::all_reduce ? 2 * one : one;
    }
    case SimAlgo::hierarchical:
      switch (op) {
        case SimColl::all_reduce:
          // intra reduce-scatter, inter all_reduce of S/G per rail, intra all_gather.
          return 2.0 * (G - 1) * in.cost(S / G) + 2.0 * (N - 1) * rail.cost(S / (static_cast<double>(G) * N));
        case SimColl::reduce_scatter:
        case SimColl::all_gather: return (G - 1) * in.cost(S / G) + (N - 1) * rail.cost(S / (static_cast<double>(G) * N));
        case SimColl::broadcast:
          return pipelined(N - 1, S, [&](double b) { return inter_hop(c, 1, false).cost(b); }) +
                 pipelined(G - 1, S, [&](double b) { return in.cost(b); });
        case SimColl::all_to_all:
          // Regroup by destination rail inside the node, then exchange along each rail.
          return (G - 1) * in.cost(S / G) + (N - 1) * rail.cost(S / N);
      }
      break;
  }
  return std::nullopt;
}

std::vector<SimRow> simulate_sweep(const ClusterSpec& c, SimColl op, const std::vector<double>& sizes) {
  std::vector<SimRow> rows;
  for (double s : sizes) {
    SimRow r;
    r.bytes = s;
    double best = 1e300;
    for (SimAlgo a : kSimAlgos) {
      r.time_s[static_cast<int>(a)] = collective_time(c, op, a, s);
      if (r.time_s[static_cast<int>(a)] && *r.time_s[static_cast<int>(a)] < best) {
        best = *r.time_s[static_cast<int>(a)];
        r.best = a;
      }
    }
    rows.push_back(r);
  }
  return rows;
}

std::string format_sweep(const ClusterSpec& c, SimColl op, const std::vector<SimRow>& rows) {
  std::ostringstream o;
  char line[512];
  const int n = c.ranks();
  o << "# " << sim_coll_name(op) << " on " << c.nodes << " node(s) x " << c.gpus_per_node << " GPUs ("
    << (c.topology == Topology::rails_only ? "rails-only" : "fat-tree") << ", " << c.nics_per_node << " x " << c.nic_gbps
    << " Gb/s NICs, intra " << c.intra_gbs << " GB/s), " << n << " ranks; busbw factor " << sim_bus_factor(op, n) << "\n";
  std::snprintf(line, sizeof line, "#%14s %12s  %12s %9s  %12s %9s  %12s %9s  %s\n", "size (B)", "count", "ring us",
                "busbw", "tree us", "busbw", "hier us", "busbw", "best");
  o << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, " %14.0f %12.0f", r.bytes, std::floor(r.bytes / 4));
    o << line;
    for (int a = 0; a < 3; ++a) {
      if (r.time_s[a]) {
        const double t = *r.time_s[a];
        const double busbw = t > 0 ? r.bytes / t / 1e9 * sim_bus_factor(op, n) : 0;
        std::snprintf(line, sizeof line, "  %12.2f %9.2f", t * 1e6, busbw);
      } else {
        std::snprintf(line, sizeof line, "  %12s %9s", "n/a", "n/a");
      }
      o << line;
    }
    o << "  " << sim_algo_name(r.best) << "\n";
  }
  return o.str();
}

// ---- calibration ----

std::vector<CollectiveSample> read_collectives_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open collectives CSV", {.file = path});
  std::string header;
  if (!std::getline(in, header)) throw Error("empty CSV", {.file = path, .expected = "a header line"});
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string f;
    while (std::getline(ss, f, ',')) v.push_back(f);
    return v;
  };
  const auto cols = split(header);
  auto index = [&](const char* name) {
    for (size_t i = 0; i < cols.size(); ++i)
      if (cols[i] == name) return i;
    throw Error("missing CSV column", {.file = path, .field = name, .expected = "the header of `zaya bench collectives --csv`",
                                       .found = header});
  };
  const size_t i_op = index("op"), i_ranks = index("ranks"), i_size = index("size_bytes"), i_time = index("oop_time_us");
  std::vector<CollectiveSample> out;
  std::string line;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const auto f = split(line);
    const std::string where = "line " + std::to_string(line_no);
    if (f.size() < cols.size())
      throw Error("short CSV row", {.file = path, .field = where, .expected = str(cols.size(), " columns"), .found = line});
    CollectiveSample s;
    s.op = f[i_op];
    try {
      size_t used = 0;
      s.ranks = std::stoi(f[i_ranks], &used);
      s.bytes = std::stod(f[i_size]);
      s.time_s = std::stod(f[i_time]) * 1e-6;
    } catch (const std::exception&) {
      throw Error("non-numeric CSV field", {.file = path, .field = where, .expected = "numbers in ranks, size_bytes, oop_time_us",
                                            .found = line});
    }
    // nccl-tests rounds sizes down to a multiple of the rank count: tiny ones become 0 bytes and
    // carry no bandwidth information.
    if (s.bytes == 0) continue;
    if (s.ranks < 1 || s.bytes < 0 || !(s.time_s > 0))
      throw Error("invalid CSV row", {.file = path, .field = where, .expected = "ranks >= 1, size >= 0, time > 0", .found = line});
    out.push_back(s);
  }
  if (out.empty()) throw Error("no rows", {.file = path, .expected = "at least one measurement"});
  return out;
}

LinearFit fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& y) {
  ZAYA_CHECK(x.size() == y.size() && x.size() >= 2, "a latency/bandwidth fit needs at least two sizes, found ", x.size());
  // Weighted least squares with weights 1/t²: minimises the relative error, so a sweep over
  // several decades of sizes is fitted at every size, not just at the largest ones. Centred
  // normal equations keep it stable from bytes to gigabytes. Exact data is recovered exactly.
  double sw = 0, mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ZAYA_CHECK(y[i] > 0, "a latency/bandwidth fit needs positive times, found ", y[i]);
    const double w = 1.0 / (y[i] * y[i]);
    sw += w, mx += w * x[i], my += w * y[i];
  }
  mx /= sw, my /= sw;
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (y[i] * y[i]);
    sxx += w * (x[i] - mx) * (x[i] - mx), sxy += w * (x[i] - mx) * (y[i] - my);
  }
  ZAYA_CHECK(sxx > 0, "a latency/bandwidth fit needs at least two different sizes");
  LinearFit f;
  f.beta_s_per_byte = sxy / sxx;
  f.alpha_s = my - f.beta_s_per_byte * mx;
  f.points = static_cast<int>(x.size());
  return f;
}

namespace {
// Steps and the fraction of S each step moves, per rank, in the one-node ring of each op.
struct RingShape {
  double steps, bytes_fraction;
};
RingShape ring_shape(const std::string& op, int n) {
  if (op == "all_reduce") return {2.0 * (n - 1), 1.0 / n};
  if (op == "broadcast") return {static_cast<double>(n - 1), 0};  // latency per hop; bandwidth once
  return {static_cast<double>(n - 1), 1.0 / n};
}
}  // namespace

std::vector<Calibration> calibrate(const std::vector<CollectiveSample>& samples, double min_bytes) {
  std::map<std::pair<std::string, int>, std::pair<std::vector<double>, std::vector<double>>> groups;
  for (const auto& s : samples)
    if (s.bytes >= min_bytes && s.ranks >= 2) {
      auto& g = groups[{s.op, s.ranks}];
      g.first.push_back(s.bytes);
      g.second.push_back(s.time_s);
    }
  ZAYA_CHECK(!groups.empty(), "no CSV rows with at least 2 ranks and size >= ", min_bytes, " bytes to calibrate on");
  std::vector<Calibration> out;
  for (const auto& [key, xy] : groups) {
    Calibration c;
    c.op = key.first;
    c.ranks = key.second;
    c.fit = fit_alpha_beta(xy.first, xy.second);
    const RingShape r = ring_shape(c.op, c.ranks);
    c.hop.alpha_s = c.fit.alpha_s / r.steps;
    // t = steps (α_hop + f S / B)  =>  β = steps f / B; broadcast: β = 1 / B.
    const double per_byte = r.bytes_fraction > 0 ? r.steps * r.bytes_fraction : 1.0;
    c.hop.bytes_per_s = c.fit.beta_s_per_byte > 0 ? per_byte / c.fit.beta_s_per_byte : 1e300;
    out.push_back(c);
  }
  return out;
}

double calibrated_time(const Calibration& cal, int ranks, double bytes) {
  const RingShape r = ring_shape(cal.op, ranks);
  if (r.bytes_fraction == 0) return r.steps * cal.hop.alpha_s + bytes / cal.hop.bytes_per_s;
  return r.steps * (cal.hop.alpha_s + r.bytes_fraction * bytes / cal.hop.bytes_per_s);
}

// ---- ZeRO-1 scaling ----

ScalingRow zero1_step(const ClusterSpec& cluster, const model::ModelConfig& m, int64_t tokens_per_gpu, int64_t seq,
                      const HardwareProfile& hw) {
  ScalingRow r;
  r.gpus = cluster.ranks();
  r.compute_s = predicted_compute_seconds(m, tokens_per_gpu, seq, hw);
  const double params = static_cast<double>(model::count_parameters(m).total);
  auto best = [&](SimColl op, double bytes) {
    double t = 1e300;
    for (SimAlgo a : kSimAlgos)
      if (auto v = collective_time(cluster, op, a, bytes)) t = std::min(t, *v);
    return t;
  };
  r.reduce_scatter_s = best(SimColl::reduce_scatter, 4.0 * params);
  r.all_gather_s = best(SimColl::all_gather, 2.0 * params);
  r.step_no_overlap_s = r.compute_s + r.reduce_scatter_s + r.all_gather_s;
  r.step_overlap_s = std::max(r.compute_s / 3, r.all_gather_s) + std::max(2 * r.compute_s / 3, r.reduce_scatter_s);
  r.efficiency_no_overlap = r.compute_s / r.step_no_overlap_s;
  r.efficiency_overlap = r.compute_s / r.step_overlap_s;
  return r;
}

}  // namespace zaya::sizing
