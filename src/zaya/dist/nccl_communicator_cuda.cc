// The NCCL backend: device buffers, one GPU per rank, bootstrapped over MPI (rank 0 makes the
// unique id, MPI_Bcast shares it, every rank calls ncclCommInitRank). start_<op> enqueues the
// operation on the communicator's stream, after the calling thread's compute stream's work so far
// (the buffers are what its kernels wrote), and records a CUDA event after it; the Work's test()
// queries that event and ncclCommGetAsyncError, and its wait() polls the same through the Watchdog
// of the MPI backend, so that on timeout the census over MPI names the ranks that never arrived
// and the NCCL communicator is aborted (not destroyed) when it goes away.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/log.h"
#include "zaya/dist/communicator.h"
#include "zaya/dist/mpi_world.h"

namespace zaya::dist {
namespace {

// A non-blocking communicator may answer ncclInProgress; it is settled right after the launch.
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) throw Error(str("NCCL ", what, " failed: ", ncclGetErrorString(r)));
}
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(str("CUDA ", what, " failed: ", cudaGetErrorString(e)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::f64: return ncclFloat64;
  }
  return ncclFloat32;
}

class NcclCommunicator;

// A device operation (complete when its event has fired) or a host one over MPI (the barrier). A
// device operation's readers on the compute stream may wait for its event on the device instead
// (Work::wait_on_compute_stream); the host still completes it later, through the watchdog.
class NcclWork final : public Work::Impl {
 public:
  NcclWork(NcclCommunicator& comm, uint64_t seq, const char* what) : comm_(comm), seq_(seq), what_(what) {}
  ~NcclWork() override;

  bool test() override;
  void wait() override;
  bool order_compute_stream() override;

  cudaEvent_t event = nullptr;
  MPI_Request request = MPI_REQUEST_NULL;
  std::pair<void*, size_t> scratch{nullptr, 0};  // the staged input of an in-place all_to_all

 private:
  bool ready();
  void complete();

  NcclCommunicator& comm_;
  uint64_t seq_;
  const char* what_;
  bool done_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  // The world: a new NCCL communicator over the ranks of `mpi` (owned), bootstrapped through it.
  NcclCommunicator(Options o, MPI_Comm mpi) : Communicator(o) {
    adopt_mpi(mpi);
    // Ranks on one node share its GPUs round-robin by node-local rank.
    MPI_Comm node;
    MPI_Comm_split_type(mpi_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int devices = cuda::device_count();
    ZAYA_CHECK(devices > 0, "the nccl backend needs a GPU: ", cuda::no_device_reason());
    device_ = local % devices;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");

    ncclUniqueId id;
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Request req;
    uint64_t seq = watchdog_->begin("nccl bootstrap broadcast");
    MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, mpi_, &req);
    watchdog_->wait(seq, "nccl bootstrap broadcast", &req, 1, options_.timeout_s, options_.census_s);
    // Non-blocking init so a rank that never joins turns into a timeout, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRank");
    settle("ncclCommInitRank");
  }

  // A sub-communicator: `comm` is being made by ncclCommSplit on every rank of `mpi` (both owned).
  NcclCommunicator(Options o, MPI_Comm mpi, ncclComm_t comm, int device) : Communicator(o), comm_(comm) {
    adopt_mpi(mpi);
    device_ = device;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    settle("ncclCommSplit");
    // NCCL and MPI both order a split's ranks by key, then by parent rank; the census speaks MPI
    // ranks, so they must be the same ranks.
    int nccl_rank = -1;
    check_nccl(ncclCommUserRank(comm_, &nccl_rank), "ncclCommUserRank");
    ZAYA_CHECK(nccl_rank == rank_, "ncclCommSplit made rank ", nccl_rank, " of what MPI_Comm_split made rank ",
               rank_);
  }

  ~NcclCommunicator() override {
    bool broken = watchdog_->broken();
    if (comm_) {
      if (broken) ncclCommAbort(comm_);
      else ncclCommDestroy(comm_);
    }
    for (auto& s : free_scratch_) cudaFree(s.first);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (compute_done_) cudaEventDestroy(compute_done_);
    if (stream_) cudaStreamDestroy(stream_);
    watchdog_.reset();
    if (!broken) MPI_Comm_free(&mpi_);
    detail::release_mpi();
  }

  Backend backend() const override { return Backend::nccl; }
  Device device() const override { return Device::cuda; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Work start_all_reduce(const void* s, void* r, size_t n, DType t) override {
    return launch("all_reduce", [&](NcclWork&) {
      check_nccl(ncclAllReduce(s, r, n, nccl_type(t), ncclSum, comm_, stream_), "ncclAllReduce");
    });
  }
  Work start_reduce_scatter(const void* s, void* r, size_t n, DType t) override {
    return launch("reduce_scatter", [&](NcclWork&) {
      check_nccl(ncclReduceScatter(s, r, n, nccl_type(t), ncclSum, comm_, stream_), "ncclReduceScatter");
    });
  }
  Work start_all_gather(const void* s, void* r, size_t n, DType t) override {
    return launch("all_gather", [&](NcclWork&) {
      check_nccl(ncclAllGather(s, r, n, nccl_type(t), comm_, stream_), "ncclAllGather");
    });
  }
  Work start_broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    ZAYA_CHECK(root >= 0 && root < size_, "broadcast root ", root, " out of range for a world of ", size_);
    return launch("broadcast", [&](NcclWork&) {
      check_nccl(ncclBroadcast(s, r, n, nccl_type(t), root, comm_, stream_), "ncclBroadcast");
    });
  }
  Work start_all_to_all(const void* s, void* r, size_t n, DType t) override {
    return launch("all_to_all", [&](NcclWork& w) {
      const size_t bytes = n * dtype_size(t);
      if (s == r && bytes) {
        // NCCL has no in-place all_to_all: stage the input in a pooled scratch buffer that the
        // Work holds until its event fires.
        w.scratch = take_scratch(bytes * size_);
        check_cuda(cudaMemcpyAsync(w.scratch.first, s, bytes * size_, cudaMemcpyDeviceToDevice, stream_),
                   "cudaMemcpyAsync");
        s = w.scratch.first;
      }
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (int p = 0; p < size_; ++p) {
        check_nccl(ncclSend(static_cast<const char*>(s) + p * bytes, n, nccl_type(t), p, comm_, stream_), "ncclSend");
        check_nccl(ncclRecv(static_cast<char*>(r) + p * bytes, n, nccl_type(t), p, comm_, stream_), "ncclRecv");
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  // NCCL has no variable-count collectives: one ncclReduce (reduce_scatter_v) or ncclBroadcast
  // (all_gather_v) per rank whose block is not empty, rooted there, grouped so they run as one
  // launch. Buckets of a flat buffer owned in contiguous ranges touch one or two ranks, so a group
  // holds few operations. In place falls out: the root's reduce or broadcast has send == recv.
  Work start_reduce_scatter_v(const void* s, void* r, std::span<const size_t> counts, DType t) override {
    block_offset(counts, "reduce_scatter_v");
    return launch("reduce_scatter_v", [&](NcclWork&) {
      const size_t ts = dtype_size(t);
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      size_t offset = 0;
      for (int p = 0; p < size_; ++p) {
        if (counts[p])
          check_nccl(ncclReduce(static_cast<const char*>(s) + offset * ts, p == rank_ ? r : nullptr, counts[p],
                                nccl_type(t), ncclSum, p, comm_, stream_),
                     "ncclReduce");
        offset += counts[p];
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  Work start_all_gather_v(const void* s, void* r, std::span<const size_t> counts, DType t) override {
    block_offset(counts, "all_gather_v");
    return launch("all_gather_v", [&](NcclWork&) {
      const size_t ts = dtype_size(t);
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      size_t offset = 0;
      for (int p = 0; p < size_; ++p) {
        char* dst = static_cast<char*>(r) + offset * ts;
        if (counts[p])
          check_nccl(ncclBroadcast(p == rank_ ? s : dst, dst, counts[p], nccl_type(t), p, comm_, stream_),
                     "ncclBroadcast");
        offset += counts[p];
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  Work start_barrier() override {
    // A host barrier over MPI: NCCL has none. Like every barrier here it orders ranks, not the
    // Works issued before it.
    const uint64_t seq = watchdog_->begin("barrier");
    auto w = std::make_unique<NcclWork>(*this, seq, "barrier");
    MPI_Ibarrier(mpi_, &w->request);
    return Work(std::move(w));
  }
  Work start_send(const void* buf, size_t n, DType t, int peer, int) override {
    ZAYA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send: bad peer rank ", peer);
    return launch("send", [&](NcclWork&) { check_nccl(ncclSend(buf, n, nccl_type(t), peer, comm_, stream_), "ncclSend"); });
  }
  Work start_recv(void* buf, size_t n, DType t, int peer, int) override {
    ZAYA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv: bad peer rank ", peer);
    return launch("recv", [&](NcclWork&) { check_nccl(ncclRecv(buf, n, nccl_type(t), peer, comm_, stream_), "ncclRecv"); });
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    ZAYA_CHECK(color >= 0, "split: color must be non-negative, found ", color);
    // MPI_Comm_split blocks until every rank calls it; the barrier first turns a rank that never
    // comes into a timeout that names it.
    barrier();
    MPI_Comm sub = MPI_COMM_NULL;
    ZAYA_CHECK(MPI_Comm_split(mpi_, color, key, &sub) == MPI_SUCCESS, "MPI_Comm_split failed");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_nccl(ncclCommSplit(comm_, color, key, &child, &config), "ncclCommSplit");
    settle("ncclCommSplit (parent)");
    detail::acquire_mpi();  // the new communicator is one more user of MPI
    return std::make_unique<NcclCommunicator>(options_, sub, child, device_);
  }

  double host_max(double v) override {
    double out = 0;
    host_op("host_max", [&](MPI_Request* r) { MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, mpi_, r); });
    return out;
  }
  int64_t host_sum(int64_t v) override {
    int64_t out = 0;
    host_op("host_sum", [&](MPI_Request* r) { MPI_Iallreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, mpi_, r); });
    return out;
  }
  void host_all_gather(const void* s, void* r, size_t bytes) override {
    ZAYA_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "host_all_gather: ", bytes, " bytes exceed MPI's int limit");
    const int n = static_cast<int>(bytes);
    host_op("host_all_gather", [&](MPI_Request* req) { MPI_Iallgather(s, n, MPI_BYTE, r, n, MPI_BYTE, mpi_, req); });
  }

  detail::Watchdog& watchdog() { return *watchdog_; }
  cudaStream_t stream() const { return stream_; }

  // Whether the communicator's enqueued and asynchronous work has settled: false while NCCL is
  // still in progress; an asynchronous error (a peer vanished) breaks the communicator and throws.
  bool async_done(uint64_t seq, const char* what) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) {
      watchdog_->mark_broken(seq, what);
      throw Error(str("NCCL ", what, " (collective #", seq, ") on rank ", rank_, " failed: ",
                      ncclGetErrorString(state), " (", ncclGetLastError(comm_), ")"));
    }
    return true;
  }

  void give_back(cudaEvent_t event, std::pair<void*, size_t> scratch) {
    if (event) free_events_.push_back(event);
    if (scratch.first) free_scratch_.push_back(scratch);
  }

 private:
  void adopt_mpi(MPI_Comm mpi) {
    mpi_ = mpi;
    MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    watchdog_ = std::make_unique<detail::Watchdog>(mpi_);
  }

  // Waits, bounded by the timeout, until a non-blocking NCCL call has settled (init, split, or an
  // enqueue that answered ncclInProgress); NCCL allows no other call on the communicator before.
  void settle(const char* what) {
    const uint64_t seq = watchdog_->begin(what);
    watchdog_->wait_until(seq, what, [&] { return async_done(seq, what); }, options_.timeout_s, options_.census_s);
  }

  // Numbers the operation, enqueues it with `issue`, lets the enqueue settle (with lazily made
  // connections, the first operation between two ranks may need its peer to be there) and records
  // the event the Work will wait for.
  template <class F>
  Work launch(const char* what, F issue) {
    const uint64_t seq = watchdog_->begin(what);
    auto w = std::make_unique<NcclWork>(*this, seq, what);
    wait_for_compute_stream();
    issue(*w);
    watchdog_->wait_until(seq, what, [&] { return async_done(seq, what); }, options_.timeout_s, options_.census_s);
    w->event = take_event();
    check_cuda(cudaEventRecord(w->event, stream_), "cudaEventRecord");
    return Work(std::move(w));
  }

  template <class F>
  void host_op(const char* what, F issue) {
    const uint64_t seq = watchdog_->begin(what);
    MPI_Request req = MPI_REQUEST_NULL;
    issue(&req);
    watchdog_->wait(seq, what, &req, 1, options_.timeout_s, options_.census_s);
  }

  // The buffers a collective reads are written by the calling thread's kernels on its compute
  // stream (core/cuda_context.h), which this communicator's non-blocking stream is not ordered
  // after: it waits, on the device, for what is queued there so far. (The other direction needs
  // nothing: a caller reads a result only after the Work completed.)
  void wait_for_compute_stream() {
    const auto compute = static_cast<cudaStream_t>(zaya::cuda::current().stream());
    if (!compute_done_) check_cuda(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(compute_done_, compute), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, compute_done_, 0), "cudaStreamWaitEvent");
  }

  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }

  // A pooled device buffer of at least `bytes` (the smallest that fits), else a new one.
  std::pair<void*, size_t> take_scratch(size_t bytes) {
    size_t best = free_scratch_.size();
    for (size_t i = 0; i < free_scratch_.size(); ++i)
      if (free_scratch_[i].second >= bytes && (best == free_scratch_.size() || free_scratch_[i].second < free_scratch_[best].second))
        best = i;
    if (best < free_scratch_.size()) {
      auto s = free_scratch_[best];
      free_scratch_.erase(free_scratch_.begin() + static_cast<ptrdiff_t>(best));
      return s;
    }
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return {p, bytes};
  }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;  // recorded on the compute stream before each operation
  std::vector<cudaEvent_t> free_events_;
  std::vector<std::pair<void*, size_t>> free_scratch_;
  std::unique_ptr<detail::Watchdog> watchdog_;
};

NcclWork::~NcclWork() {
  if (done_ || comm_.watchdog().broken()) return;  // an unfinished one keeps its event and scratch
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("a ", what_, " Work destroyed before completion failed while waiting for it: ", e.what());
  }
}

bool NcclWork::ready() {
  if (!event) {
    int flag = 0;
    int rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      comm_.watchdog().mark_broken(seq_, what_);
      throw Error(str("MPI error in collective #", seq_, " (", what_, "): code ", rc));
    }
    return flag != 0;
  }
  if (!comm_.async_done(seq_, what_)) return false;
  cudaError_t e = cudaEventQuery(event);
  if (e == cudaErrorNotReady) return false;
  check_cuda(e, "collective stream");
  return true;
}

void NcclWork::complete() {
  done_ = true;
  comm_.give_back(event, scratch);
  event = nullptr;
  scratch = {nullptr, 0};
}

bool NcclWork::test() {
  if (done_) return true;
  if (!comm_.watchdog().poll([&] { return ready(); })) return false;
  complete();
  return true;
}

// The stream waits for the event as recorded now: the event going back to the pool and being
// recorded again for a later operation does not move that wait (CUDA's cudaStreamWaitEvent).
bool NcclWork::order_compute_stream() {
  if (done_ || !event) return false;  // complete already, or the host barrier
  comm_.watchdog().check_usable();
  const auto compute = static_cast<cudaStream_t>(zaya::cuda::current().stream());
  check_cuda(cudaStreamWaitEvent(compute, event, 0), "cudaStreamWaitEvent");
  return true;
}

void NcclWork::wait() {
  if (done_) return;
  const Options& o = comm_.options();
  comm_.watchdog().wait_until(seq_, what_, [&] { return ready(); }, o.timeout_s, o.census_s);
  complete();
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Options options) {
  detail::acquire_mpi();
  MPI_Comm mpi = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &mpi);
  return std::make_unique<NcclCommunicator>(options, mpi);
}

}  // namespace zaya::dist
