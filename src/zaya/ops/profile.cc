#include "zaya/ops/profile.h"

#include "zaya/ops/cpu/gemm_cpu.h"

namespace zaya::ops {

double gemm_seconds(Device device) { return device == Device::cpu ? cpu::gemm_time_stats().seconds : 0.0; }

}  // namespace zaya::ops
