// The NCCL backend: device buffers, one GPU per rank, bootstrapped over MPI (rank 0 makes the
// unique id, MPI_Bcast shares it, every rank calls ncclCommInitRank). Each call is enqueued on the
// communicator's stream and then waited for by the same Watchdog as the MPI backend: it polls
// cudaStreamQuery and ncclCommGetAsyncError against the deadline, and on timeout aborts the NCCL
// communicator and runs the census over MPI to name the ranks that never arrived.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstring>

#include "zaya/core/cuda_runtime.h"
#include "zaya/dist/communicator.h"
#include "zaya/dist/mpi_world.h"

namespace zaya::dist {
namespace {

// A non-blocking communicator may answer ncclInProgress; completion is polled in finish().
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
  }
  return ncclFloat32;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(Options o) : Communicator(o) {
    detail::acquire_mpi();
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi_);
    MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    watchdog_ = std::make_unique<detail::Watchdog>(mpi_);

    // Ranks on one node share its GPUs round-robin by node-local rank.
    MPI_Comm node;
    MPI_Comm_split_type(mpi_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int devices = cuda::device_count();
    ZAYA_CHECK(devices > 0, "the nccl backend needs a GPU: ", cuda::no_device_reason());
    check_cuda(cudaSetDevice(local % devices), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");

    ncclUniqueId id;
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Request req;
    watchdog_->begin("nccl bootstrap broadcast");
    MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, mpi_, &req);
    watchdog_->wait(&req, 1, options_.timeout_s, options_.census_s);
    // Non-blocking init so a rank that never joins turns into a timeout, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRank");
    watchdog_->begin("ncclCommInitRank");
    watchdog_->wait_until([&] { return async_done(); }, options_.timeout_s, options_.census_s);
  }

  ~NcclCommunicator() override {
    bool broken = watchdog_->broken();
    if (comm_) {
      if (broken) ncclCommAbort(comm_);
      else ncclCommDestroy(comm_);
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    watchdog_.reset();
    if (!broken) MPI_Comm_free(&mpi_);
    detail::release_mpi();
  }

  Backend backend() const override { return Backend::nccl; }
  Device device() const override { return Device::cuda; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* s, void* r, size_t n, DType t) override {
    begin("all_reduce");
    check_nccl(ncclAllReduce(s, r, n, nccl_type(t), ncclSum, comm_, stream_), "ncclAllReduce");
    finish();
  }
  void reduce_scatter(const void* s, void* r, size_t n, DType t) override {
    begin("reduce_scatter");
    check_nccl(ncclReduceScatter(s, r, n, nccl_type(t), ncclSum, comm_, stream_), "ncclReduceScatter");
    finish();
  }
  void all_gather(const void* s, void* r, size_t n, DType t) override {
    begin("all_gather");
    check_nccl(ncclAllGather(s, r, n, nccl_type(t), comm_, stream_), "ncclAllGather");
    finish();
  }
  void broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    ZAYA_CHECK(root >= 0 && root < size_, "broadcast root ", root, " out of range for a world of ", size_);
    begin("broadcast");
    check_nccl(ncclBroadcast(s, r, n, nccl_type(t), root, comm_, stream_), "ncclBroadcast");
    finish();
  }
  void all_to_all(const void* s, void* r, size_t n, DType t) override {
    begin("all_to_all");
    const size_t bytes = n * dtype_size(t);
    if (s == r && bytes) {
      // NCCL has no in-place all_to_all: stage the input in a scratch buffer kept between calls.
      if (scratch_bytes_ < bytes * size_) {
        if (scratch_) cudaFree(scratch_);
        check_cuda(cudaMalloc(&scratch_, bytes * size_), "cudaMalloc");
        scratch_bytes_ = bytes * size_;
      }
      check_cuda(cudaMemcpyAsync(scratch_, s, bytes * size_, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
      s = scratch_;
    }
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      check_nccl(ncclSend(static_cast<const char*>(s) + p * bytes, n, nccl_type(t), p, comm_, stream_), "ncclSend");
      check_nccl(ncclRecv(static_cast<char*>(r) + p * bytes, n, nccl_type(t), p, comm_, stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish();
  }
  void barrier() override {
    // A host barrier over MPI: NCCL has none, and its work is already complete at this point
    // because every call here waits for its stream.
    watchdog_->begin("barrier");
    MPI_Request req;
    MPI_Ibarrier(mpi_, &req);
    watchdog_->wait(&req, 1, options_.timeout_s, options_.census_s);
  }
  void send(const void* buf, size_t n, DType t, int peer, int) override {
    ZAYA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send: bad peer rank ", peer);
    begin("send");
    check_nccl(ncclSend(buf, n, nccl_type(t), peer, comm_, stream_), "ncclSend");
    finish();
  }
  void recv(void* buf, size_t n, DType t, int peer, int) override {
    ZAYA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv: bad peer rank ", peer);
    begin("recv");
    check_nccl(ncclRecv(buf, n, nccl_type(t), peer, comm_, stream_), "ncclRecv");
    finish();
  }
  double host_max(double v) override {
    watchdog_->begin("host_max");
    double out = 0;
    MPI_Request req;
    MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, mpi_, &req);
    watchdog_->wait(&req, 1, options_.timeout_s, options_.census_s);
    return out;
  }
  int64_t host_sum(int64_t v) override {
    watchdog_->begin("host_sum");
    int64_t out = 0;
    MPI_Request req;
    MPI_Iallreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, mpi_, &req);
    watchdog_->wait(&req, 1, options_.timeout_s, options_.census_s);
    return out;
  }
  void host_all_gather(const void* s, void* r, size_t bytes) override {
    watchdog_->begin("host_all_gather");
    MPI_Request req;
    MPI_Iallgather(s, static_cast<int>(bytes), MPI_BYTE, r, static_cast<int>(bytes), MPI_BYTE, mpi_, &req);
    watchdog_->wait(&req, 1, options_.timeout_s, options_.census_s);
  }

 private:
  void begin(const char* what) { watchdog_->begin(what); }
  // Done when the stream is idle; an asynchronous NCCL error (a peer vanished) is thrown at once.
  bool async_done() {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state == ncclInProgress) return false;
    check_nccl(state, "asynchronous operation");
    return true;
  }
  void finish() {
    watchdog_->wait_until(
        [&] {
          if (!async_done()) return false;
          cudaError_t e = cudaStreamQuery(stream_);
          if (e == cudaErrorNotReady) return false;
          check_cuda(e, "collective stream");
          return true;
        },
        options_.timeout_s, options_.census_s);
  }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<detail::Watchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Options options) {
  return std::make_unique<NcclCommunicator>(options);
}

}  // namespace zaya::dist
