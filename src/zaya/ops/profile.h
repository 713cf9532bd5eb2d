// Device-neutral readings of the backends' own profile counters, for code above the ops that times
// the parts of a step (the model's section timing) without knowing the device.
#pragma once

#include "zaya/core/dtype.h"

namespace zaya::ops {

// Seconds this process has spent in GEMMs on `device` so far, where its backend keeps such a count
// (the CPU: the wall time of its GEMM calls, ops/cpu/gemm_cpu.h); 0 where it keeps none.
double gemm_seconds(Device device);

}  // namespace zaya::ops
