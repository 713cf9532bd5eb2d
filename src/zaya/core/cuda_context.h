// The per-thread CUDA device context: where every CUDA kernel finds its device, its stream, the
// cuBLASLt handle and workspace, and scratch memory (docs/CONTRIBUTING.md, "Device context:
// ambient, not an argument"; docs/cuda.md).
//
// A plain C++ header (no CUDA types: handles are void*), so host code compiled by g++ and .cu files
// share it. In CPU-only builds every function exists and throws a zaya::Error saying the build has
// no CUDA; where the build has CUDA but the machine has no GPU, current() throws one saying so.
#pragma once

#include <cstddef>
#include <string_view>

#include "zaya/core/dtype.h"

namespace zaya::cuda {

class DeviceContext {
 public:
  // Binds the calling thread's current CUDA device; creates the compute stream.
  DeviceContext();
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  // The compute stream (cudaStream_t). A blocking stream: the legacy default stream, on which
  // cuda::copy and Tensor::to/copy_from/zero_ run, waits for its work and it for theirs, so a tensor
  // copied to the host after a kernel holds the kernel's result without an explicit synchronize.
  void* stream() const { return stream_; }

  // The cuBLASLt handle (cublasLtHandle_t) and its workspace, created on first use.
  void* cublaslt();
  void* cublaslt_workspace();
  static constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;

  // Device scratch of at least `bytes` for one kernel's partial results (the deterministic
  // column sums). Grows only: after the first steps the sizes repeat and nothing is allocated.
  // Valid until the next scratch() call on this context; work queued on stream() before a growth is
  // finished first (the old buffer is freed only after a stream synchronize).
  void* scratch(size_t bytes);

  // Copies `bytes` between host and device memory, queued on stream() (host memory should be
  // pinned for the copy to be asynchronous; pageable memory is staged by the driver).
  void copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  // Waits for everything queued on stream().
  void synchronize();

 private:
  int device_ = 0;
  void* stream_ = nullptr;
  void* cublaslt_ = nullptr;
  void* workspace_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// The calling thread's context, created on first use for the thread's current CUDA device.
// Throws zaya::Error when the build has no CUDA or no GPU is present.
DeviceContext& current();

// Throws zaya::Error "<what> needs a GPU, but <why>" when no CUDA device can be used (the build has
// no CUDA, or the driver finds no GPU). Allocating CUDA tensors and launching kernels call it first,
// so their failures name what was asked for rather than a CUDA error code.
void require_device(std::string_view what);

}  // namespace zaya::cuda
