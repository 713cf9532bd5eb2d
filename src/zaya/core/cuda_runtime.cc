#include "zaya/core/cuda_runtime.h"

#include "zaya/core/error.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

#ifdef ZAYA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zaya::cuda {

#ifdef ZAYA_HAVE_CUDA

namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(str("CUDA ", what, " failed: ", cudaGetErrorString(err)));
}
cudaMemcpyKind kind_of(Device dst, Device src) {
  if (dst == Device::cpu && src == Device::cpu) return cudaMemcpyHostToHost;
  if (dst == Device::cuda && src == Device::cpu) return cudaMemcpyHostToDevice;
  if (dst == Device::cpu && src == Device::cuda) return cudaMemcpyDeviceToHost;
  return cudaMemcpyDeviceToDevice;
}
}  // namespace

bool built_with_cuda() { return true; }

int real_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not poisoned
    return 0;
  }
  return n;
}

std::string real_no_device_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(err);
  }
  return n == 0 ? "the driver reports no device" : "";
}

std::vector<DeviceInfo> real_devices() {
  std::vector<DeviceInfo> out;
  int n = real_device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties");
    out.push_back({i, p.name, p.totalGlobalMem, p.multiProcessorCount, p.major, p.minor});
  }
  return out;
}

void* real_malloc_device(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  check(cudaMalloc(&p, bytes), str("cudaMalloc of ", bytes, " bytes").c_str());
  return p;
}
void real_free_device(void* ptr) { cudaFree(ptr); }
void* real_malloc_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), str("cudaHostAlloc of ", bytes, " bytes").c_str());
  return p;
}
void real_free_pinned(void* ptr) { cudaFreeHost(ptr); }
// Both wait for the default stream before returning. cudaMemset and device-to-device cudaMemcpy
// return before the device has done them, and a host-to-device cudaMemcpy from pageable memory may
// return once the data is staged; the default stream orders them before later work on blocking
// streams only. The communicators' streams are non-blocking, so without the wait a collective
// read buffers still being written: `zaya bench collectives --backend nccl` on an H100 counted
// 110,560 wrong elements in a 2 MiB broadcast whose receive buffer was still being zeroed.
void real_memset_device(void* ptr, int value, size_t bytes) {
  check(cudaMemset(ptr, value, bytes), "cudaMemset");
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize after cudaMemset");
}
void real_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, kind_of(dst_device, src_device)), "cudaMemcpy");
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize after cudaMemcpy");
}
void real_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

Stream::Stream() {
  if (emulated()) return;
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  handle_ = s;
}
Stream::~Stream() {
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}
void Stream::synchronize() {
  if (!handle_) return;
  before_host_wait();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)), "cudaStreamSynchronize");
}

Event::Event() {
  if (emulated()) return;
  cudaEvent_t e;
  check(cudaEventCreate(&e), "cudaEventCreate");
  handle_ = e;
}
Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}
void Event::record(const Stream& stream) { record_on(stream.handle()); }
void Event::record_on(void* stream) {
  if (!handle_) return;
  check(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}
void Event::synchronize() {
  if (!handle_) return;
  before_host_wait();
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "cudaEventSynchronize");
}
float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  if (!start.handle_ || !end.handle_) return ms;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(end.handle_)),
        "cudaEventElapsedTime");
  return ms;
}

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(str(what, ": this zaya was built without CUDA (configure with the 'cuda' preset)"));
}
}  // namespace

bool built_with_cuda() { return false; }
int real_device_count() { return 0; }
std::string real_no_device_reason() { return "built without CUDA"; }
std::vector<DeviceInfo> real_devices() { return {}; }
void* real_malloc_device(size_t) { no_cuda("device allocation"); }
void real_free_device(void*) {}
void* real_malloc_pinned(size_t) { no_cuda("pinned host allocation"); }
void real_free_pinned(void*) {}
void real_memset_device(void*, int, size_t) { no_cuda("device memset"); }
void real_copy(void*, Device, const void*, Device, size_t) { no_cuda("device copy"); }
void real_synchronize() {}
Stream::Stream() {
  if (!emulated()) no_cuda("CUDA stream");
}
Stream::~Stream() = default;
void Stream::synchronize() {}
Event::Event() {
  if (!emulated()) no_cuda("CUDA event");
}
Event::~Event() = default;
void Event::record(const Stream&) {}
void Event::record_on(void*) {}
void Event::synchronize() {}
float Event::elapsed_ms(const Event&, const Event&) { return 0; }

#endif


// ---- The emulated device (cuda_runtime.h) ----

namespace {
// -1: not decided yet (the environment is read at the first query), 0: off, 1: on.
std::atomic<int> g_emulated{-1};
std::atomic<int64_t> g_emulated_kernels{0};

bool env_asks_for_emulation() {
  const char* v = std::getenv("ZAYA_EMULATE_CUDA");
  return v != nullptr && std::string_view(v) != "" && std::string_view(v) != "0";
}
}  // namespace

void set_emulated(bool on) {
  ZAYA_CHECK(!on || real_device_count() == 0,
             "the emulated CUDA device is for machines without a GPU, and this one has ", real_device_count());
  g_emulated.store(on ? 1 : 0);
}

bool emulated() {
  int state = g_emulated.load(std::memory_order_relaxed);
  if (state < 0) {
    // From the environment, and only where no GPU answers (a real device always wins).
    state = env_asks_for_emulation() && real_device_count() == 0 ? 1 : 0;
    int unset = -1;
    g_emulated.compare_exchange_strong(unset, state);
    state = g_emulated.load();
  }
  return state == 1;
}

EmulatedKernelScope::EmulatedKernelScope() { g_emulated_kernels.fetch_add(1); }
EmulatedKernelScope::~EmulatedKernelScope() { g_emulated_kernels.fetch_sub(1); }
bool in_emulated_kernel() { return g_emulated_kernels.load() > 0; }

int device_count() { return emulated() ? 1 : real_device_count(); }
std::string no_device_reason() { return emulated() ? "" : real_no_device_reason(); }
std::vector<DeviceInfo> devices() {
  if (emulated()) return {{0, "emulated CUDA device (host memory; no kernels run on a GPU)", 0, 0, 0, 0}};
  return real_devices();
}
void* malloc_device(size_t bytes) {
  if (!emulated()) return real_malloc_device(bytes);
  if (bytes == 0) return nullptr;
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);  // cudaMalloc's alignment
  ZAYA_CHECK(p != nullptr, "emulated device: out of host memory allocating ", bytes, " bytes");
  return p;
}
void free_device(void* ptr) {
  if (emulated()) std::free(ptr);
  else real_free_device(ptr);
}
namespace {
thread_local HostWaitHook t_host_wait_hook = nullptr;
thread_local bool t_in_host_wait_hook = false;
}  // namespace

void set_host_wait_hook(HostWaitHook hook) { t_host_wait_hook = hook; }

void before_host_wait() {
  // Not again from inside the hook: completing a collective polls events, it never waits here.
  if (!t_host_wait_hook || t_in_host_wait_hook) return;
  t_in_host_wait_hook = true;
  try {
    t_host_wait_hook();
  } catch (...) {
    t_in_host_wait_hook = false;
    throw;
  }
  t_in_host_wait_hook = false;
}

void memset_device(void* ptr, int value, size_t bytes) {
  before_host_wait();
  if (emulated()) std::memset(ptr, value, bytes);
  else real_memset_device(ptr, value, bytes);
}
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  before_host_wait();
  if (emulated()) std::memcpy(dst, src, bytes);
  else real_copy(dst, dst_device, src, src_device, bytes);
}
void synchronize() {
  before_host_wait();
  if (!emulated()) real_synchronize();
}
void* malloc_pinned(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!emulated() && real_device_count() > 0) return real_malloc_pinned(bytes);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  ZAYA_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
  return p;
}
void free_pinned(void* ptr) {
  if (!emulated() && real_device_count() > 0) real_free_pinned(ptr);
  else std::free(ptr);
}

}  // namespace zaya::cuda
