#include "zaya/dist/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zaya/core/cuda_runtime.h"

namespace zaya::dist {

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::local: return "local";
    case Backend::mpi: return "mpi";
    case Backend::nccl: return "nccl";
  }
  return "?";
}

Backend parse_backend(const std::string& name, const std::string& field, bool* is_auto) {
  *is_auto = false;
  if (name == "auto") {
    *is_auto = true;
    return Backend::local;
  }
  if (name == "local") return Backend::local;
  if (name == "mpi") return Backend::mpi;
  if (name == "nccl") return Backend::nccl;
  throw Error("unknown communicator backend", {.field = field, .expected = "auto, local, mpi or nccl", .found = name});
}

namespace {

// The calling thread's Works left to the device and not yet completed on the host, oldest first.
thread_local std::vector<Work::Impl*> t_device_waits;

// The host-wait hook (cuda_runtime.h): completes them on the host, oldest first, each through its
// timeout. One taken off the list before its wait, so that an error leaves the rest listed.
void complete_device_waits() {
  while (!t_device_waits.empty()) {
    Work::Impl* impl = t_device_waits.front();
    t_device_waits.erase(t_device_waits.begin());
    impl->wait();
  }
}

}  // namespace

Work::Work(Work&& other) noexcept : impl_(std::move(other.impl_)), on_device_(other.on_device_) {
  other.on_device_ = false;  // the list holds the Impl, which moved with impl_
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    forget_device_wait();
    impl_ = std::move(other.impl_);
    on_device_ = other.on_device_;
    other.on_device_ = false;
  }
  return *this;
}

Work::~Work() { forget_device_wait(); }

void Work::forget_device_wait() noexcept {
  if (!on_device_) return;
  on_device_ = false;
  auto it = std::find(t_device_waits.begin(), t_device_waits.end(), impl_.get());
  if (it != t_device_waits.end()) t_device_waits.erase(it);
}

void Work::wait() {
  if (!impl_) return;
  forget_device_wait();  // an error surfaces here, once: the next host wait does not repeat it
  impl_->wait();
  impl_.reset();
}

bool Work::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  forget_device_wait();
  impl_.reset();
  return true;
}

bool Work::wait_on_compute_stream() {
  if (!impl_ || on_device_) return on_device_;
  if (!impl_->order_compute_stream()) {
    wait();
    return false;
  }
  on_device_ = true;
  t_device_waits.push_back(impl_.get());
  cuda::set_host_wait_hook(&complete_device_waits);
  return true;
}

void Communicator::set_timeout(double seconds) {
  ZAYA_CHECK(seconds > 0, "collective timeout must be positive, found ", seconds, " s");
  options_.timeout_s = seconds;
}

size_t Communicator::block_offset(std::span<const size_t> counts, const char* what, size_t* total) const {
  ZAYA_CHECK(counts.size() == static_cast<size_t>(size()), what, ": expected one count per rank (", size(),
             "), found ", counts.size());
  size_t before = 0, sum = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (r == static_cast<size_t>(rank())) before = sum;
    sum += counts[r];
  }
  if (total) *total = sum;
  return before;
}

namespace {

// First variable that is set and parses as a non-negative integer, else `fallback`.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (!v || !*v) continue;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (*end == '\0' && x >= 0) return static_cast<int>(x);
  }
  return fallback;
}

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(Options o) : Communicator(o) {}
  Backend backend() const override { return Backend::local; }
  Device device() const override { return Device::cpu; }
  int rank() const override { return 0; }
  int size() const override { return 1; }

  // With one rank every collective is the identity from send to recv, done inside start_<op>.
  Work start_all_reduce(const void* s, void* r, size_t n, DType t) override { return copy(s, r, n, t); }
  Work start_reduce_scatter(const void* s, void* r, size_t n, DType t) override { return copy(s, r, n, t); }
  Work start_all_gather(const void* s, void* r, size_t n, DType t) override { return copy(s, r, n, t); }
  Work start_broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    ZAYA_CHECK(root == 0, "broadcast root ", root, " out of range for a world of 1");
    return copy(s, r, n, t);
  }
  Work start_all_to_all(const void* s, void* r, size_t n, DType t) override { return copy(s, r, n, t); }
  Work start_reduce_scatter_v(const void* s, void* r, std::span<const size_t> counts, DType t) override {
    block_offset(counts, "reduce_scatter_v");
    return copy(s, r, counts[0], t);
  }
  Work start_all_gather_v(const void* s, void* r, std::span<const size_t> counts, DType t) override {
    block_offset(counts, "all_gather_v");
    return copy(s, r, counts[0], t);
  }
  Work start_barrier() override { return {}; }
  Work start_send(const void*, size_t, DType, int peer, int) override {
    throw Error(str("send to rank ", peer, " in a world of 1: there is no peer"));
  }
  Work start_recv(void*, size_t, DType, int peer, int) override {
    throw Error(str("recv from rank ", peer, " in a world of 1: there is no peer"));
  }
  std::unique_ptr<Communicator> split(int color, int) override {
    ZAYA_CHECK(color >= 0, "split: color must be non-negative, found ", color);
    return std::make_unique<LocalCommunicator>(options_);
  }
  double host_max(double v) override { return v; }
  int64_t host_sum(int64_t v) override { return v; }
  void host_all_gather(const void* s, void* r, size_t bytes) override { copy_now(s, r, bytes, DType::u8); }

 private:
  static void copy_now(const void* s, void* r, size_t n, DType t) {
    if (s != r && n > 0) std::memmove(r, s, n * dtype_size(t));
  }
  static Work copy(const void* s, void* r, size_t n, DType t) {
    copy_now(s, r, n, t);
    return {};
  }
};

}  // namespace

int launcher_world_size() {
  return env_int({"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}, 1);
}
int launcher_rank() {
  const int rank = env_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}, -1);
  if (rank >= 0) return rank;
  return std::getenv("SLURM_STEP_NUM_TASKS") ? env_int({"SLURM_PROCID"}, 0) : 0;
}

std::unique_ptr<Communicator> make_local_communicator(Options options) {
  return std::make_unique<LocalCommunicator>(options);
}

#ifndef ZAYA_HAVE_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(Options) {
  throw Error("the nccl backend needs a CUDA build of zaya", {.field = "--backend", .expected = "mpi or local",
                                                              .found = "nccl"});
}
#endif

std::unique_ptr<Communicator> make_communicator(Backend backend, bool is_auto, Options options) {
  if (is_auto) {
    // Under mpirun -np 1 there is nobody to talk to: skip MPI entirely.
    if (launcher_world_size() <= 1) return make_local_communicator(options);
    if (cuda::device_count() > 0) return make_nccl_communicator(options);
    return make_mpi_communicator(options);
  }
  switch (backend) {
    case Backend::local:
      ZAYA_CHECK(launcher_world_size() <= 1, "the local backend is a world of one, but the launcher started ",
                 launcher_world_size(), " ranks (use --backend mpi)");
      return make_local_communicator(options);
    case Backend::mpi: return make_mpi_communicator(options);
    case Backend::nccl: return make_nccl_communicator(options);
  }
  return nullptr;
}

}  // namespace zaya::dist
