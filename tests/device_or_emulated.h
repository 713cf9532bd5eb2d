// For tests of the device path (the model, optimizer and trainer with Device::cuda tensors): they
// run on a real GPU when one is present, and otherwise on the emulated device (cuda_runtime.h),
// which runs the CPU kernels on host memory labelled as device memory. On a GPU they check the
// CUDA kernels together with the placement; emulated, they check the placement alone (every tensor
// an op touches on the device, every host round trip an explicit copy), which is what breaks when
// the model, the optimizer or the trainer change, on machines where no GPU is at hand.
#pragma once

#include <gtest/gtest.h>

#include "zaya/core/cuda_runtime.h"

namespace zaya::test {

// True on a real GPU; false when the test runs on the emulated device (switched on here).
inline bool real_gpu_or_emulated() {
  if (cuda::device_count() > 0 && !cuda::emulated()) return true;
  cuda::set_emulated(true);
  return false;
}

// Switches the emulated device off again at the end of its scope, when `on` (a test binary whose
// other tests expect no device where there is none): `EmulationOffAtExit off{!real};`.
struct EmulationOffAtExit {
  bool on;
  ~EmulationOffAtExit() {
    if (on) cuda::set_emulated(false);
  }
};

}  // namespace zaya::test

// At the top of a device-path test: says which of the two it is running on.
#define ZAYA_GPU_OR_EMULATED(real)                                                                \
  const bool real = ::zaya::test::real_gpu_or_emulated();                                         \
  if (!real) RecordProperty("device", "emulated (no GPU: placement checked, CUDA kernels not run)")
