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
// Number of usable devices; 0 when built without CUDA or when the driver finds none.
int device_count();
// Why device_count() is 0, for messages ("built without CUDA", the driver's error string).
std::string no_device_reason();
std::vector<DeviceInfo> devices();

void* malloc_device(size_t bytes);
void free_device(void* ptr);
// memset_device and copy are complete when they return, also for work that follows on other
// (non-blocking) streams.
void memset_device(void* ptr, int value, size_t bytes);
// Copies between any pair of host/device pointers.
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void synchronize();

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
  void synchronize();
  // Milliseconds between two recorded events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void* handle_ = nullptr;
};

}  // namespace zaya::cuda
