// Hardware profiles: the peaks a model is sized against. Built-in ones come from datasheets
// (REFERENCES.md "Hardware peaks", docs/sizing.md lists the sources); measured ones are JSON files
// written by `zaya bench gemm` (which can fold in a `zaya bench membw --json` result).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zaya::sizing {

// One measured GEMM: C[M,N] = A[M,K] B[K,N] at `flops_per_s` (2MNK / median time).
struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// One measured call of a layer's experts op (ops::experts_forward, `zaya bench gemm
// --experts-tokens`): `tokens` rows routed round-robin over `experts_hit` = min(tokens, experts)
// of the layer's `experts` experts of hidden H and width I, weights in `weight_dtype`, each call on
// another layer's weights (never cache-resident, as in decode). `seconds` is the median wall time
// of one call: the gather, both grouped GEMMs and SwiGLU, as the decoder runs them.
struct ExpertsPoint {
  int64_t tokens = 0, experts = 0, experts_hit = 0, hidden = 0, intermediate = 0;
  std::string weight_dtype;  // "f32" or "bf16"
  double seconds = 0;
  double rows_per_expert() const { return static_cast<double>(tokens) / static_cast<double>(experts_hit); }
  // Weight bytes the call reads: each hit expert's gate_up [2I, H] and down [H, I].
  double weight_bytes() const;
};
// Bytes per element of an ExpertsPoint's weight_dtype ("f32" 4, "bf16" 2); 0 for anything else.
int64_t experts_weight_bytes(const std::string& weight_dtype);

struct HardwareProfile {
  std::string name;
  double peak_bf16_flops = 0;      // dense bf16 FLOP/s (the MFU denominator)
  double achievable_flops = 0;     // large-GEMM rate actually reached (measured or typical)
  double memory_bytes = 0;         // device memory
  double memory_bandwidth = 0;     // bytes/s
  double intra_node_bandwidth = 0; // bytes/s per GPU, one direction, to peers in the node
  double inter_node_bandwidth = 0; // bytes/s per GPU, one direction, over the NICs
  int gpus_per_node = 8;
  std::string source;
  // Measured GEMM efficiency (`zaya bench gemm`); empty for the datasheet profiles, which then
  // run every GEMM at achievable_flops.
  std::string gemm_dtype;          // "bf16" or "f32": what the table was measured in
  std::vector<GemmPoint> gemm_table;
  // Measured experts op (decode's few rows per expert); empty: decode prices experts as GEMMs.
  std::vector<ExpertsPoint> experts_table;
};

// "mi300x", "h100", "h200"; throws zaya::Error listing the names for anything else.
HardwareProfile builtin_profile(const std::string& name);
std::vector<std::string> builtin_profile_names();
// A profile JSON (fields as in HardwareProfile); throws naming the file and the field.
HardwareProfile load_profile(const std::string& path);
// The same JSON text load_profile reads (round trip), and writing it to a file.
std::string profile_to_json(const HardwareProfile& p);
void save_profile(const HardwareProfile& p, const std::string& path);
// A name of a built-in profile, or a path to a JSON file.
HardwareProfile resolve_profile(const std::string& name_or_path);

// Seconds one layer's experts op takes when `tokens` tokens hit `distinct` experts (a count, may be
// fractional), from the profile's experts_table entries of exactly this expert shape (E experts of
// hidden H and width I, weights of `weight_bytes` per element); negative when there is none. Per
// entry the seconds per hit expert (seconds / experts_hit) are averaged per token count; the query
// takes that of its token count, interpolated linearly in log(tokens) between measured counts, held
// below the smallest (one token already streams a whole expert's weights) and, above the largest,
// scaled by the rows per expert over the largest entry's (the compute-bound limit; rows as the
// measurement routes them, tokens / min(tokens, E)). The result is distinct × seconds per hit
// expert: the measurement hits min(tokens, E) experts round-robin, decode's random routing fewer.
double measured_experts_seconds(const HardwareProfile& p, int64_t experts, int64_t hidden, int64_t intermediate,
                                int64_t weight_bytes, double tokens, double distinct);

// The rate one GEMM of this size is predicted to run at. Without a table: achievable_flops. With
// one: the measured rates averaged per GEMM size (2MNK), then interpolated linearly in log(size)
// between neighbours and held constant beyond the smallest and largest measured sizes. Size is
// the variable because small GEMMs are launch/memory bound and large ones compute bound; shape
// (aspect ratio) is second order and the table is too sparse to resolve it.
double gemm_rate(const HardwareProfile& p, int64_t m, int64_t n, int64_t k);
// The mean measured rate of GEMMs of exactly this (M, N, K) when the table has any, else gemm_rate.
// Decode's GEMMs have one to a few rows: a [1, N, K] GEMM streams its N·K weights for 2NK FLOPs and
// runs far below a [32, N, K/32]-sized one, which the size-only interpolation would give it.
double gemm_rate_at_shape(const HardwareProfile& p, int64_t m, int64_t n, int64_t k);

}  // namespace zaya::sizing
