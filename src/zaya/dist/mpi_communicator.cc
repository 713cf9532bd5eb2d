// The MPI backend: host buffers, every operation a non-blocking MPI call whose request a Work holds
// and the Watchdog polls against the timeout (a blocking MPI call cannot be interrupted, so it
// could never name the rank that failed to show up).
#include <mpi.h>

#include <cstring>
#include <exception>
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

class MpiCommunicator;

// One MPI request in flight, plus what has to happen on this rank once it completes: the move
// that puts an in-place reduce_scatter's block where NCCL puts it, and the return of a staging
// buffer to the communicator's pool.
class MpiWork final : public Work::Impl {
 public:
  MpiWork(MpiCommunicator& comm, uint64_t seq, const char* what) : comm_(comm), seq_(seq), what_(what) {}
  ~MpiWork() override;

  bool test() override;
  void wait() override;

  MPI_Request request = MPI_REQUEST_NULL;
  // After completion: memmove(move_to, move_from, move_bytes).
  void* move_to = nullptr;
  const void* move_from = nullptr;
  size_t move_bytes = 0;
  std::vector<char> scratch;  // the staged input of an in-place all_to_all
  // The count and displacement arrays of a _v collective: MPI reads them until it completes.
  std::vector<int> counts, displs;

 private:
  void complete();

  MpiCommunicator& comm_;
  uint64_t seq_;
  const char* what_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (a duplicate or split of MPI_COMM_WORLD).
  MpiCommunicator(Options o, MPI_Comm comm) : Communicator(o), comm_(comm) {
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

  Work start_all_reduce(const void* send, void* recv, size_t count, DType t) override {
    auto w = begin("all_reduce");
    const void* s = send == recv ? MPI_IN_PLACE : send;
    check(MPI_Iallreduce(s, recv, mpi_count(count, "all_reduce"), mpi_datatype(t), mpi_sum(t), comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_reduce_scatter(const void* send, void* recv, size_t recv_count, DType t) override {
    auto w = begin("reduce_scatter");
    const size_t bytes = recv_count * dtype_size(t);
    const bool in_place = static_cast<const char*>(send) + rank_ * bytes == static_cast<const char*>(recv);
    int n = mpi_count(recv_count, "reduce_scatter");
    if (in_place) {
      // MPI's in-place form leaves block `rank` at the start of the buffer; NCCL's (ours) wants it
      // at offset rank*count, so reduce in place and move it there on completion.
      void* base = const_cast<void*>(send);
      check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, n, mpi_datatype(t), mpi_sum(t), comm_, &w->request));
      if (rank_ != 0 && bytes) {
        w->move_to = recv;
        w->move_from = base;
        w->move_bytes = bytes;
      }
      return Work(std::move(w));
    }
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_datatype(t), mpi_sum(t), comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_all_gather(const void* send, void* recv, size_t send_count, DType t) override {
    auto w = begin("all_gather");
    const size_t bytes = send_count * dtype_size(t);
    const bool in_place = static_cast<const char*>(recv) + rank_ * bytes == static_cast<const char*>(send);
    int n = mpi_count(send_count, "all_gather");
    // MPI's in-place all_gather reads this rank's block from its place in recv: exactly ours.
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_datatype(t), recv, n, mpi_datatype(t), comm_,
                         &w->request));
    return Work(std::move(w));
  }

  Work start_broadcast(const void* send, void* recv, size_t count, DType t, int root) override {
    ZAYA_CHECK(root >= 0 && root < size_, "broadcast root ", root, " out of range for a world of ", size_);
    auto w = begin("broadcast");
    if (rank_ == root && send != recv && count) std::memmove(recv, send, count * dtype_size(t));
    check(MPI_Ibcast(recv, mpi_count(count, "broadcast"), mpi_datatype(t), root, comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_all_to_all(const void* send, void* recv, size_t count, DType t) override {
    auto w = begin("all_to_all");
    int n = mpi_count(count, "all_to_all");
    if (send == recv) {
      // MPI_IN_PLACE for non-blocking all_to_all is missing or slow in some MPI libraries, so
      // stage the input in a scratch copy. The Work owns it while in flight (several may be) and
      // then returns it to a pool, so a steady loop does not allocate.
      size_t bytes = count * size_ * dtype_size(t);
      w->scratch = take_scratch(bytes);
      if (bytes) std::memcpy(w->scratch.data(), send, bytes);
      send = w->scratch.data();
    }
    check(MPI_Ialltoall(send, n, mpi_datatype(t), recv, n, mpi_datatype(t), comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType t) override {
    size_t total = 0;
    const size_t offset = block_offset(counts, "reduce_scatter_v", &total);
    mpi_count(total, "reduce_scatter_v");  // every count and displacement then fits an int
    auto w = begin("reduce_scatter_v");
    set_counts(*w, counts);
    const size_t ts = dtype_size(t);
    const bool in_place = static_cast<const char*>(send) + offset * ts == static_cast<const char*>(recv);
    if (in_place) {
      // As for reduce_scatter: MPI leaves this rank's block at the start of the buffer, ours goes
      // at its offset.
      void* base = const_cast<void*>(send);
      check(MPI_Ireduce_scatter(MPI_IN_PLACE, base, w->counts.data(), mpi_datatype(t), mpi_sum(t), comm_, &w->request));
      if (offset && counts[rank_]) {
        w->move_to = recv;
        w->move_from = base;
        w->move_bytes = counts[rank_] * ts;
      }
      return Work(std::move(w));
    }
    check(MPI_Ireduce_scatter(send, recv, w->counts.data(), mpi_datatype(t), mpi_sum(t), comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_all_gather_v(const void* send, void* recv, std::span<const size_t> counts, DType t) override {
    size_t total = 0;
    const size_t offset = block_offset(counts, "all_gather_v", &total);
    mpi_count(total, "all_gather_v");  // every count and displacement then fits an int
    auto w = begin("all_gather_v");
    set_counts(*w, counts);
    const bool in_place = static_cast<const char*>(recv) + offset * dtype_size(t) == static_cast<const char*>(send);
    // MPI's in-place form reads this rank's block from its place in recv, as ours does.
    check(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, w->counts[rank_], mpi_datatype(t), recv, w->counts.data(),
                          w->displs.data(), mpi_datatype(t), comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_barrier() override {
    auto w = begin("barrier");
    check(MPI_Ibarrier(comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_send(const void* buf, size_t count, DType t, int peer, int tag) override {
    check_peer(peer, "send");
    auto w = begin("send");
    check(MPI_Isend(buf, mpi_count(count, "send"), mpi_datatype(t), peer, tag, comm_, &w->request));
    return Work(std::move(w));
  }

  Work start_recv(void* buf, size_t count, DType t, int peer, int tag) override {
    check_peer(peer, "recv");
    auto w = begin("recv");
    check(MPI_Irecv(buf, mpi_count(count, "recv"), mpi_datatype(t), peer, tag, comm_, &w->request));
    return Work(std::move(w));
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    ZAYA_CHECK(color >= 0, "split: color must be non-negative, found ", color);
    // MPI_Comm_split blocks until every rank calls it; the barrier first turns a rank that never
    // comes into a timeout that names it.
    barrier();
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub));
    detail::acquire_mpi();  // the new communicator is one more user of MPI
    return std::make_unique<MpiCommunicator>(options_, sub);
  }

  double host_max(double v) override {
    double out = 0;
    host_op("host_max", [&](MPI_Request* r) { return MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm_, r); });
    return out;
  }

  void host_all_gather(const void* send, void* recv, size_t bytes) override {
    int n = mpi_count(bytes, "host_all_gather");
    host_op("host_all_gather",
            [&](MPI_Request* r) { return MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, r); });
  }

  int64_t host_sum(int64_t v) override {
    int64_t out = 0;
    host_op("host_sum", [&](MPI_Request* r) { return MPI_Iallreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, comm_, r); });
    return out;
  }

  detail::Watchdog& watchdog() { return *watchdog_; }
  void give_back_scratch(std::vector<char> s) {
    if (s.capacity()) free_scratch_.push_back(std::move(s));
  }

 private:
  std::unique_ptr<MpiWork> begin(const char* what) {
    uint64_t seq = watchdog_->begin(what);
    return std::make_unique<MpiWork>(*this, seq, what);
  }
  template <class F>
  void host_op(const char* what, F issue) {
    auto w = begin(what);
    check(issue(&w->request));
    Work(std::move(w)).wait();
  }
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
  // The Work's int counts and displacements for a _v collective (their sum was checked to fit).
  static void set_counts(MpiWork& w, std::span<const size_t> counts) {
    w.counts.resize(counts.size());
    w.displs.resize(counts.size());
    int displ = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      w.counts[r] = static_cast<int>(counts[r]);
      w.displs[r] = displ;
      displ += w.counts[r];
    }
  }
  // A pooled buffer of at least `bytes`, resized to exactly `bytes`.
  std::vector<char> take_scratch(size_t bytes) {
    std::vector<char> s;
    if (!free_scratch_.empty()) {
      s = std::move(free_scratch_.back());
      free_scratch_.pop_back();
    }
    s.resize(bytes);
    return s;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<detail::Watchdog> watchdog_;
  std::vector<std::vector<char>> free_scratch_;
};

MpiWork::~MpiWork() {
  if (done_ || comm_.watchdog().broken()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("a ", what_, " Work destroyed before completion failed while waiting for it: ", e.what());
  }
}

void MpiWork::complete() {
  done_ = true;
  if (move_bytes) std::memmove(move_to, move_from, move_bytes);
  comm_.give_back_scratch(std::move(scratch));
}

bool MpiWork::test() {
  if (done_) return true;
  if (!comm_.watchdog().test(seq_, what_, &request, 1)) return false;
  complete();
  return true;
}

void MpiWork::wait() {
  if (done_) return;
  const Options& o = comm_.options();
  comm_.watchdog().wait(seq_, what_, &request, 1, o.timeout_s, o.census_s);
  complete();
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Options options) {
  detail::acquire_mpi();
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return std::make_unique<MpiCommunicator>(options, comm);
}

}  // namespace zaya::dist
