// What this machine is: cores, memory, CPU ISA, library versions and CUDA devices. Printed by
// `zaya sysinfo` and stamped into benchmark results so numbers always carry their machine.
#pragma once

#include <string>

namespace zaya::bench {

struct SysInfo {
  int logical_cpus = 0;
  std::string cpu_model;
  double memory_gib = 0;
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_tile = false, amx_bf16 = false;
  std::string onednn_version, blas_version, mpi_version, sentencepiece_version;
  std::string cuda;  // one line per device, or "no CUDA device (<reason>)"
};

SysInfo query_sysinfo();
std::string format_sysinfo(const SysInfo& info);

}  // namespace zaya::bench
