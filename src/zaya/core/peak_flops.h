// The fixed peaks MFU is measured against: a GPU's datasheet dense bf16 rate, and for a CPU a stated
// formula (cores x clock x f32 FLOPs per cycle of its widest FMA units). Both are known before the
// run starts and do not depend on how busy the machine is, so MFU compares between runs; a GEMM
// timed at start-up does not (it read 56-159 GFLOP/s on one shared machine in one afternoon).
//
// The datasheet table is also the peak of sizing's built-in hardware profiles (sizing/hardware.h),
// so `zaya size` and a training run divide by the same number.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace zaya {

// A peak rate with its name (what it is) and basis (where the number comes from).
struct PeakFlops {
  std::string name;    // "h100", "cpu"
  double flops_per_s = 0;
  std::string basis;   // "NVIDIA H100 SXM datasheet, dense bf16" or the CPU formula written out
};

// The named datasheet peaks (dense bf16, no sparsity): "a100", "h100", "h100-pcie", "h200",
// "mi300x". Unknown name: nullopt.
std::optional<PeakFlops> datasheet_peak(const std::string& name);
std::vector<std::string> datasheet_peak_names();
// The datasheet peak of a GPU by the name its driver reports ("NVIDIA H100 80GB HBM3",
// "AMD Instinct MI300X"); nullopt for a GPU the table does not know.
std::optional<PeakFlops> gpu_peak_by_device_name(const std::string& device_name);

// What the CPU formula reads of a CPU.
struct CpuFacts {
  std::string model;      // /proc/cpuinfo "model name"
  std::string vendor;     // "GenuineIntel", "AuthenticAMD", ...
  int family = 0;         // /proc/cpuinfo "cpu family"
  bool avx = false, avx2 = false, fma = false, avx512f = false;
  int cores = 0;          // physical cores the run computes on
  double ghz = 0;         // the clock the formula uses
  std::string ghz_source; // where the clock was read
};

// f32 FLOPs per cycle per core: 2 (multiply and add) x lanes x FMA pipes, assuming the two FMA
// pipes of the widest vectors that server cores of the last decade have: 64 with AVX-512 (AMD
// Zen 4 executes 512-bit FMAs on two 256-bit pipes: 32), 32 with AVX2 + FMA, 16 with AVX (one add
// and one multiply pipe), 8 otherwise.
int f32_flops_per_cycle(const CpuFacts& cpu);
// cores x ghz x f32_flops_per_cycle, named "cpu", its basis the formula with its numbers. Throws
// zaya::Error when the cores or the clock are unknown (the caller then needs a stated figure).
PeakFlops cpu_peak(const CpuFacts& cpu);

// This machine's CPU: the model, vendor and family from /proc/cpuinfo, the ISA from cpu_isa(), the
// physical cores among the CPUs this process may run on (capped at `threads`, the run's thread
// count: idle cores do no work), and the highest clock known: cpufreq's cpuinfo_max_freq, else the
// nominal one (cpufreq's base_frequency, the "@ X GHz" of the model name, or /proc/cpuinfo's
// "cpu MHz", which on a VM is the host's fixed TSC rate), which ghz_source then calls nominal.
CpuFacts detect_cpu(int threads);

}  // namespace zaya
