// The CUDA runtime as zaya uses it: device query, allocation, copies, streams and events.
// Every function exists in CPU-only builds too: queries report no device, the rest throw an
// Error saying the build has no CUDA, so callers need no #ifdefs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"

namespace zaya::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;
  int multiprocessors = 0;
  int major = 0, minor = 0;  // compute capability
};

bool built_with_cuda();

// The emulated device: a test harness for the device path on machines without a GPU. When on
// (set_emulated(true), or ZAYA_EMULATE_CUDA=1 in the environment), Device::cuda tensors live in
// host memory, copies and memsets are memcpy/memset, streams and events do nothing, and every op
// front runs its CPU kernel on them (ops/checks.h, OpDevice). What it checks is the placement
// around the kernels: a tensor left on the host where the device is expected fails the op's device
// check, and host code that reads or writes a device tensor's memory outside an op (Tensor::data
// outside a kernel) throws. What it cannot check is the CUDA kernels themselves, their streams and
// their speed: those need a GPU (scripts/gpu_check.sh). Never on when a real GPU is present.
void set_emulated(bool on);
bool emulated();
// Counts op calls running a CPU kernel on emulated device memory, during which Tensor::data may
// reach that memory. Held by OpDevice for the duration of the kernel.
class EmulatedKernelScope {
 public:
  EmulatedKernelScope();
  ~EmulatedKernelScope();
  EmulatedKernelScope(const EmulatedKernelScope&) = delete;
  EmulatedKernelScope& operator=(const EmulatedKernelScope&) = delete;
};
bool in_emulated_kernel();
// Number of usable devices; 0 when built without CUDA or when the driver finds none.
int device_count();
// Why device_count() is 0, for messages ("built without CUDA", the driver's error string).
std::string no_device_reason();
std::vector<DeviceInfo> devices();

void* malloc_device(size_t bytes);
void free_device(void* ptr);
// Page-locked host memory (cudaHostAlloc): device-to-host copies into it run at the link's full
// rate. Plain host memory in CPU-only builds and on the emulated device.
void* malloc_pinned(size_t bytes);
void free_pinned(void* ptr);
// memset_device and copy are complete when they return, also for work that follows on other
// (non-blocking) streams.
void memset_device(void* ptr, int value, size_t bytes);
// Copies between any pair of host/device pointers.
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void synchronize();

// Host waits and the collectives the device waits for. A collective's Work may order the compute
// stream after itself without the host waiting (dist::Work::wait_on_compute_stream). Should that
// collective never complete (a peer died), the compute stream would stand still, and a host wait
// on it would block for good, past the communicator's timeout and without naming anyone. So every
// host wait on the device in core (copy, memset_device, synchronize, Stream/Event/DeviceContext
// synchronize) first calls the calling thread's hook, which completes those collectives on the
// host through their timeouts; it may throw their errors. Per thread, since the compute stream is
// (cuda_context.h); null (nothing to do) until dist sets it. Called on the emulated device too, so
// tests without a GPU reach it. cudaFree also waits for the device but is not hooked: it runs in
// destructors, which must not throw.
using HostWaitHook = void (*)();
void set_host_wait_hook(HostWaitHook hook);
void before_host_wait();

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return handle_; }  // cudaStream_t
  void synchronize();

 private:
  void* handle_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& stream);
  // Records on a raw cudaStream_t, e.g. the compute stream (cuda::current().stream()).
  void record_on(void* stream);
  void synchronize();
  // Milliseconds between two recorded events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void* handle_ = nullptr;
};

}  // namespace zaya::cuda
