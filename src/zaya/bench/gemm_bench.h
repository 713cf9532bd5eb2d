// `zaya bench gemm`: GEMM throughput versus shape, timed with warm-up and repeats (median), on the
// CPU (oneDNN, ops::gemm) or on a CUDA device (cuBLASLt, gemm_bench_cuda.cc: CUDA builds only).
// The results become the `gemm_table` of a hardware profile that `zaya size` prices GEMMs with.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/model/config.h"
#include "zaya/sizing/hardware.h"

namespace zaya::bench {

struct GemmCase {
  std::string label;  // "qkv_proj fwd", "square", "sweep"
  int64_t m = 0, n = 0, k = 0;
  int64_t count = 1;  // times per training step (model shapes); 1 for sweeps
  bool square() const { return m == n && n == k; }
};

// Every GEMM of one training step of `c` at `tokens` tokens per micro-batch
// (sizing::model_gemms), plus a square reference GEMM of `ref_dim` for the "% of best square"
// column.
std::vector<GemmCase> model_gemm_cases(const model::ModelConfig& c, int64_t tokens, int64_t ref_dim);
// Squares at every power of two in [min_dim, max_dim] and at the non-powers 96, 192, 768, 1000,
// 3000 inside it; plus every (M, N, K) from the powers of four in the range (aspect ratios).
std::vector<GemmCase> sweep_gemm_cases(int64_t min_dim, int64_t max_dim);

struct GemmBenchOptions {
  std::vector<GemmCase> cases;
  DType dtype = DType::bf16;  // f32 or bf16 inputs; f32 accumulation and output
  std::string backend = "cpu";  // cpu or cuda
  int warmup = 2, repeats = 5;
  void validate() const;      // throws zaya::Error naming the flag
};

struct GemmResult {
  GemmCase shape;
  double median_s = 0;
  double flops_per_s = 0;
};

// Runs every case, prints a table (shape, time, GFLOP/s, % of the best square GEMM) and returns
// the rows. Backend cuda without a device (or in a CPU build) throws "no CUDA device".
std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions& o, std::ostream& out);
std::string format_gemm_table(const std::vector<GemmResult>& rows);

// Folds results into a profile: the GEMM table, achievable_flops = the best square rate, and
// peak_bf16_flops = `peak` when given (> 0), else kept from `base`, else the best measured rate.
sizing::HardwareProfile profile_from_gemm(const std::vector<GemmResult>& rows, DType dtype, sizing::HardwareProfile base,
                                          double peak);
// The memory a model must fit in on that backend, for a profile's memory_bytes: the host's RAM for
// cpu, device 0's memory for cuda (throws "no CUDA device" without one).
double backend_memory_bytes(const std::string& backend);
// memory_bandwidth from a `zaya bench membw --json` file: the best triad rate at its largest array.
double membw_from_json(const std::string& path);

#ifdef ZAYA_HAVE_CUDA
// cuBLASLt timing of one case (gemm_bench_cuda.cc); seconds per GEMM, median of `repeats`.
double time_gemm_cuda(const GemmCase& c, DType dtype, int warmup, int repeats);
#endif

}  // namespace zaya::bench
