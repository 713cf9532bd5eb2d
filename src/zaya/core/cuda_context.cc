#include "zaya/core/cuda_context.h"

#include <memory>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"

#ifdef ZAYA_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

namespace zaya::cuda {

void require_device(std::string_view what) {
  if (!built_with_cuda())
    throw Error(str(what, " needs a GPU, but this zaya was built without CUDA (configure with the 'cuda' preset)"));
  if (device_count() == 0) throw Error(str(what, " needs a GPU, but no GPU is present (", no_device_reason(), ")"));
}

DeviceContext& current() {
  // One per thread, as CUDA keeps the current device per thread; destroyed with the thread.
  thread_local std::unique_ptr<DeviceContext> context;
  if (!context) {
    require_device("the CUDA device context");
    context = std::make_unique<DeviceContext>();
  }
  return *context;
}

#ifdef ZAYA_HAVE_CUDA

namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(str("CUDA ", what, " failed: ", cudaGetErrorString(err)));
}
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

DeviceContext::DeviceContext() {
  check(cudaGetDevice(&device_), "cudaGetDevice");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");  // blocking: ordered with the default stream
  stream_ = s;
}

DeviceContext::~DeviceContext() {
  // Destructors do not throw: errors here (a context torn down after a device fault) are ignored.
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  if (cublaslt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(cublaslt_));
  if (workspace_) cudaFree(workspace_);
  if (scratch_) cudaFree(scratch_);
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

void* DeviceContext::cublaslt() {
  if (!cublaslt_) {
    cublasLtHandle_t h;
    cublasStatus_t st = cublasLtCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(str("cublasLtCreate failed with status ", static_cast<int>(st)));
    cublaslt_ = h;
  }
  return cublaslt_;
}

void* DeviceContext::cublaslt_workspace() {
  if (!workspace_) workspace_ = malloc_device(kCublasLtWorkspaceBytes);
  return workspace_;
}

void* DeviceContext::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) {
      synchronize();  // kernels queued earlier may still read the old buffer
      cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    scratch_ = malloc_device(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

void DeviceContext::copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = dst_device == Device::cpu
                            ? (src_device == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                            : (src_device == Device::cpu ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  check(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream_)), "cudaMemcpyAsync");
}

void DeviceContext::synchronize() {
  before_host_wait();
  check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
}

#else  // CPU-only build: current() throws before a context is made; these are never reached.

DeviceContext::DeviceContext() { require_device("the CUDA device context"); }
DeviceContext::~DeviceContext() = default;
void* DeviceContext::cublaslt() { require_device("cuBLASLt"); return nullptr; }
void* DeviceContext::cublaslt_workspace() { require_device("cuBLASLt"); return nullptr; }
void* DeviceContext::scratch(size_t) { require_device("device scratch"); return nullptr; }
void DeviceContext::copy_async(void*, Device, const void*, Device, size_t) { require_device("a device copy"); }
void DeviceContext::synchronize() {}

#endif

}  // namespace zaya::cuda
