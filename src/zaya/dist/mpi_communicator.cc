// The MPI backend: host buffers, every operation a non-blocking MPI call that the Watchdog polls
// against the timeout (a blocking MPI call cannot be interrupted, so it could never name the rank
// that failed to show up).
#include <mpi.h>

#include <cstring>
#include <vector>

#include "zaya/core/log.h"
#include "zaya/dist/communicator.h"
#include "zaya/dist/mpi_world.h"

namespace zaya::dist {
namespace {

using detail::mpi_datatype;
using detail::mpi_sum;

// MPI counts are int: refuse what would overflow rather than truncate silently.
int mpi_count(size_t n, const char* what) {
  ZAYA_CHECK(n <= static_cast<size_t>(INT32_MAX), what, ": count ", n, " exceeds MPI's int limit (2^31-1)");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(Options o) : Communicator(o) {
    detail::acquire_mpi();
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    // Errors come back as codes that we turn into zaya::Error with context, not aborts.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    watchdog_ = std::make_unique<detail::Watchdog>(comm_);
  }
  ~MpiCommunicator() override {
    bool broken = watchdog_->broken();
    watchdog_.reset();
    if (!broken) MPI_Comm_free(&comm_);
    detail::release_mpi();
  }

  Backend backend() const override { return Backend::mpi; }
  Device device() const override { return Device::cpu; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* send, void* recv, size_t count, DType t) override {
    start("all_reduce");
    const void* s = send == recv ? MPI_IN_PLACE : send;
    check(MPI_Iallreduce(s, recv, mpi_count(count, "all_reduce"), mpi_datatype(t), mpi_sum(t), comm_, &req_));
    finish();
  }

  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType t) override {
    start("reduce_scatter");
    const size_t bytes = recv_count * dtype_size(t);
    const bool in_place = static_cast<const char*>(send) + rank_ * bytes == static_cast<const char*>(recv);
    int n = mpi_count(recv_count, "reduce_scatter");
    if (in_place) {
      // MPI's in-place form leaves block `rank` at the start of the buffer; NCCL's (ours) wants it
      // at offset rank*count, so reduce in place and move it there.
      void* base = const_cast<void*>(send);
      check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, n, mpi_datatype(t), mpi_sum(t), comm_, &req_));
      finish();
      if (rank_ != 0 && bytes) std::memmove(recv, base, bytes);
      return;
    }
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_datatype(t), mpi_sum(t), comm_, &req_));
    finish();
  }

  void all_gather(const void* send, void* recv, size_t send_count, DType t) override {
    start("all_gather");
    const size_t bytes = send_count * dtype_size(t);
    const bool in_place = static_cast<const char*>(recv) + rank_ * bytes == static_cast<const char*>(send);
    int n = mpi_count(send_count, "all_gather");
    // MPI's in-place all_gather reads this rank's block from its place in recv: exactly ours.
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_datatype(t), recv, n, mpi_datatype(t), comm_, &req_));
    finish();
  }

  void broadcast(const void* send, void* recv, size_t count, DType t, int root) override {
    ZAYA_CHECK(root >= 0 && root < size_, "broadcast root ", root, " out of range for a world of ", size_);
    start("broadcast");
    if (rank_ == root && send != recv && count) std::memmove(recv, send, count * dtype_size(t));
    check(MPI_Ibcast(recv, mpi_count(count, "broadcast"), mpi_datatype(t), root, comm_, &req_));
    finish();
  }

  void all_to_all(const void* send, void* recv, size_t count, DType t) override {
    start("all_to_all");
    int n = mpi_count(count, "all_to_all");
    if (send == recv) {
      // MPI_IN_PLACE for non-blocking all_to_all is missing or slow in some MPI libraries, so
      // stage the input in a scratch copy (kept between calls: no allocation in a steady loop).
      size_t bytes = count * size_ * dtype_size(t);
      if (scratch_.size() < bytes) scratch_.resize(bytes);
      if (bytes) std::memcpy(scratch_.data(), send, bytes);
      send = scratch_.data();
    }
    check(MPI_Ialltoall(send, n, mpi_datatype(t), recv, n, mpi_datatype(t), comm_, &req_));
    finish();
  }

  void barrier() override {
    start("barrier");
    check(MPI_Ibarrier(comm_, &req_));
    finish();
  }

  void send(const void* buf, size_t count, DType t, int peer, int tag) override {
    check_peer(peer, "send");
    start("send");
    check(MPI_Isend(buf, mpi_count(count, "send"), mpi_datatype(t), peer, tag, comm_, &req_));
    finish();
  }

  void recv(void* buf, size_t count, DType t, int peer, int tag) override {
    check_peer(peer, "recv");
    start("recv");
    check(MPI_Irecv(buf, mpi_count(count, "recv"), mpi_datatype(t), peer, tag, comm_, &req_));
    finish();
  }

  double host_max(double v) override {
    start("host_max");
    double out = 0;
    check(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm_, &req_));
    finish();
    return out;
  }

  void host_all_gather(const void* send, void* recv, size_t bytes) override {
    start("host_all_gather");
    int n = mpi_count(bytes, "host_all_gather");
    check(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req_));
    finish();
  }

  int64_t host_sum(int64_t v) override {
    start("host_sum");
    int64_t out = 0;
    check(MPI_Iallreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, comm_, &req_));
    finish();
    return out;
  }

 private:
  void start(const char* what) { watchdog_->begin(what); }
  void finish() { watchdog_->wait(&req_, 1, options_.timeout_s, options_.census_s); }
  void check(int rc) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error(str("MPI error in collective #", watchdog_->seq(), ": ", std::string(text, len)));
  }
  void check_peer(int peer, const char* what) const {
    ZAYA_CHECK(peer >= 0 && peer < size_ && peer != rank_, what, ": peer rank ", peer,
               " is not another rank of a world of ", size_);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::unique_ptr<detail::Watchdog> watchdog_;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Options options) {
  return std::make_unique<MpiCommunicator>(options);
}

}  // namespace zaya::dist
