// `zaya bench gemm --experts-tokens`: the decoder's experts op (ops::experts_forward) timed at a
// model's expert shapes, for the `experts_table` of a hardware profile (sizing/hardware.h).
//
// A plain GEMM table cannot price decode's experts: the op runs a grouped call with a few rows per
// expert, and its speed is that of its grouped path (threads over experts, per-expert calls on a
// GPU), not of one ops::gemm repeated. So this times the op itself, as the decoder calls it:
//  * `tokens` rows routed round-robin (uniformly) over min(tokens, E) experts, so each hit expert
//    gets tokens / hit rows (the remainder one more), distinct experts' weights;
//  * each call on the next of several layers' weights, and each pass over the layers on the next
//    experts, so a call reads weights that left the caches since their last use, as a decode step
//    (which reads every layer's once) does: the layers together hold at least `min_bytes`.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/model/config.h"
#include "zaya/sizing/hardware.h"

namespace zaya::bench {

struct ExpertsBenchOptions {
  int64_t experts = 0, hidden = 0, intermediate = 0;  // the model's E, H, I
  std::vector<int64_t> tokens;                        // rows per call to time, each >= 1
  DType dtype = DType::f32;                           // the weights: f32, or bf16 (f32 accumulation)
  Device device = Device::cpu;
  int warmup = 2, repeats = 5;           // passes over the layers: untimed, then timed (median)
  double min_bytes = 512.0 * (1 << 20);  // the layers' weights together, far past any cache
  void validate() const;                 // throws zaya::Error naming the flag
};
// E, H, I from a model config.
ExpertsBenchOptions experts_bench_options(const model::ModelConfig& c, std::vector<int64_t> tokens);

// Layers of weights the bench cycles through: enough for min_bytes, at least 2.
int64_t experts_bench_layers(const ExpertsBenchOptions& o);
// Rows of each expert for one call: tokens spread round-robin over min(tokens, E) experts starting
// at expert `first` (mod E). Sums to tokens.
std::vector<int64_t> round_robin_rows(int64_t tokens, int64_t experts, int64_t first);

// Times ops::experts_forward at every token count, prints a table (tokens, experts hit, rows per
// expert, median us per call, us per hit expert, GB/s of weights read) and returns the entries.
std::vector<sizing::ExpertsPoint> run_experts_bench(const ExpertsBenchOptions& o, std::ostream& out);
std::string format_experts_table(const std::vector<sizing::ExpertsPoint>& rows);

// The profile's experts_table with `rows` in it: an entry of the same shape, dtype and tokens is
// replaced (a re-measurement), every other kept (other token counts, other models).
void merge_experts_table(sizing::HardwareProfile& p, const std::vector<sizing::ExpertsPoint>& rows);

}  // namespace zaya::bench
