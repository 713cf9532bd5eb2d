// Communicator: the collectives data parallelism needs (all_reduce, reduce_scatter, all_gather,
// broadcast, all_to_all, barrier, send/recv) behind one interface with three backends:
//
//   local  a world of one: copies, no MPI init (what `zaya train` on one process uses)
//   mpi    host buffers, MPI point-to-point and non-blocking collectives (OpenMPI 4.1 here)
//   nccl   device buffers, bootstrapped over MPI (ncclGetUniqueId on rank 0 + MPI_Bcast +
//          ncclCommInitRank); built only when CUDA is (nccl_communicator_cuda.cc)
//
// Conventions (the same as NCCL's, so callers need not care which backend they hold):
// - counts are elements, not bytes; buffers live on device(); every rank passes the same count.
// - all_reduce and reduce_scatter(_v) sum. bf16 sums in fp32 per element and rounds once per
//   pairwise combine (MPI: a custom MPI_Op; NCCL: its native bf16 sum); f32 and f64 sum in their
//   own precision (f64 for reductions whose result must not depend on how they are split).
// - reduce_scatter(send, recv, recv_count): send holds size()*recv_count elements, rank r receives
//   the sum of block r. In place when recv == send + rank()*recv_count (the rest of send is then
//   unspecified afterwards).
// - all_gather(send, recv, send_count): recv holds size()*send_count elements, block j comes from
//   rank j. In place when send == recv + rank()*send_count.
// - all_to_all(send, recv, count): both hold size()*count elements; block j of send goes to rank
//   j and lands in block rank() of j's recv. In place when send == recv.
// - reduce_scatter_v(send, recv, counts) and all_gather_v(send, recv, counts): the same with a block
//   of counts[r] elements for rank r (counts.size() == size(); zero allowed), the blocks laid out
//   back to back in rank order; offset(r) = counts[0] + ... + counts[r-1]. reduce_scatter_v: send
//   holds sum(counts) elements, rank r receives counts[r] elements, the sum of block r; in place
//   when recv == send + offset(rank()). all_gather_v: rank r sends counts[r] elements, recv holds
//   sum(counts) with block j from rank j; in place when send == recv + offset(rank()). Every rank
//   passes the same counts (not checked: it would cost a collective); a rank whose count is 0
//   still issues the call (its out-of-place reduce_scatter_v recv is not written).
// - all_reduce / broadcast are in place when send == recv.
//
// Every collective has a non-blocking form, start_<op>(...), that issues it and returns a Work; the
// blocking form <op>(...) is exactly start_<op>(...).wait(). Several Works may be outstanding at once
// and waited in any order, provided every rank of the communicator issues its collectives in the
// same order (the order of start_* calls, blocking calls included). The caller keeps the buffers
// alive and untouched until the Work completes, and a Work must not outlive its communicator.
//
// Every wait has a timeout (Options::timeout_s). When it expires the communicator finds which
// ranks never arrived (see docs/dist.md, "Timeouts") and throws CollectiveTimeout naming them; the
// communicator is then broken: every later call throws, and it will not finalize MPI (a finalize
// with a dead peer would hang) — the process should exit non-zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/core/error.h"

namespace zaya::dist {

enum class Backend { local, mpi, nccl };
std::string_view backend_name(Backend b);  // "local", "mpi", "nccl"
// "auto" | "local" | "mpi" | "nccl"; throws zaya::Error naming `field` otherwise.
Backend parse_backend(const std::string& name, const std::string& field, bool* is_auto);

struct Options {
  double timeout_s = 300;  // per collective; a rank that has not arrived by then is named
  // How long a rank that timed out waits for its peers to answer the census before naming the
  // silent ones. Peers inside any collective answer at once; this only bounds the dead.
  double census_s = 1.0;
};

// Thrown when a collective does not complete in time. missing() lists the ranks that never
// arrived (empty when every rank answered the census but the collective still did not finish).
class CollectiveTimeout : public Error {
 public:
  CollectiveTimeout(const std::string& message, std::vector<int> missing)
      : Error(message), missing_(std::move(missing)) {}
  const std::vector<int>& missing() const { return missing_; }

 private:
  std::vector<int> missing_;
};

// A collective in flight, returned by Communicator::start_<op>. Move-only value: a default
// constructed (or moved-from) Work has nothing to wait for and counts as complete, which is what the
// local backend returns since its collectives finish inside start_<op>.
//
// wait() returns when the collective has completed on this rank (its recv buffer may be read, its
// send buffer reused), or throws CollectiveTimeout after the communicator's timeout, naming the
// ranks that never issued it. test() says whether it has completed, without blocking; it also
// throws on a broken communicator or an asynchronous backend error. Destroying a Work that has not
// completed waits for it (errors are logged, not thrown, since a destructor cannot throw), unless
// the communicator is already broken.
//
// wait_on_compute_stream() is the wait of a reader that is a kernel, not the host: it makes the
// calling thread's compute stream (core/cuda_context.h) wait, on the device, for the operation, so
// that kernels queued there from now on read its results, and returns at once: the host goes on
// queueing them while the operation is in flight. That is what a device backend's operation
// allows (nccl: a CUDA event the stream waits for). An operation that completes on the host (mpi,
// local, the nccl backend's host barrier) is waited for there, as wait() does, and so is one
// already complete; it returns whether the wait was left to the device. A Work left to the device
// is still pending on the host: its failure or timeout surfaces when it is completed there, by
// wait() or test(), by its destruction, or by the next host wait on the device (a copy to the
// host, a synchronize), which first completes, through the timeout, every Work the calling thread
// left to the device (cuda_runtime.h, set_host_wait_hook), so a hung collective is named rather
// than freezing the stream the host waits on. Such a Work must be completed or destroyed on the
// thread that called wait_on_compute_stream().
class [[nodiscard]] Work {
 public:
  // What a backend implements; wait() and test() may be called again after completion.
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool test() = 0;
    virtual void wait() = 0;
    // Makes the calling thread's compute stream wait for the operation on the device and returns
    // true; false where the operation is the host's (the caller then waits for it on the host).
    virtual bool order_compute_stream() { return false; }
  };

  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work(Work&& other) noexcept;
  Work& operator=(Work&& other) noexcept;
  ~Work();

  void wait();
  bool test();
  bool wait_on_compute_stream();

 private:
  void forget_device_wait() noexcept;  // leaves the thread's list of Works left to the device

  std::unique_ptr<Impl> impl_;  // null once complete
  bool on_device_ = false;      // left to the device by wait_on_compute_stream(), not yet complete
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual Backend backend() const = 0;
  virtual Device device() const = 0;  // where collective buffers must live
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Non-blocking forms: issue the operation and return its Work.
  virtual Work start_all_reduce(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual Work start_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype) = 0;
  virtual Work start_all_gather(const void* send, void* recv, size_t send_count, DType dtype) = 0;
  virtual Work start_broadcast(const void* send, void* recv, size_t count, DType dtype, int root) = 0;
  virtual Work start_all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  // Variable block sizes, counts[r] elements for rank r (see the conventions above): what gradient
  // buckets need when the ranks own contiguous ranges of the flat buffer of unequal sizes.
  virtual Work start_reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                                      DType dtype) = 0;
  virtual Work start_all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                                  DType dtype) = 0;
  // Completes once every rank has issued its barrier. It orders ranks, not data: Works issued
  // before it are not implied complete.
  virtual Work start_barrier() = 0;
  // Point-to-point; a send must be matched by a recv of the same count and tag on `peer`. The nccl
  // backend ignores tags (sends and recvs between two ranks match in issue order) and runs a
  // communicator's operations one after another in issue order, so the issue order alone must not
  // deadlock there (e.g. even ranks send first); MPI also allows every rank to post its recv first.
  virtual Work start_send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual Work start_recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;

  // Blocking forms: start_<op>(...).wait().
  void all_reduce(const void* send, void* recv, size_t count, DType dtype) {
    start_all_reduce(send, recv, count, dtype).wait();
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype) {
    start_reduce_scatter(send, recv, recv_count, dtype).wait();
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
    start_all_gather(send, recv, send_count, dtype).wait();
  }
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) {
    start_broadcast(send, recv, count, dtype, root).wait();
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) {
    start_all_to_all(send, recv, count, dtype).wait();
  }
  void reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) {
    start_reduce_scatter_v(send, recv, counts, dtype).wait();
  }
  void all_gather_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) {
    start_all_gather_v(send, recv, counts, dtype).wait();
  }
  void barrier() { start_barrier().wait(); }
  void send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) {
    start_send(buf, count, dtype, peer, tag).wait();
  }
  void recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) {
    start_recv(buf, count, dtype, peer, tag).wait();
  }

  // Control-plane reductions of host scalars (timings, error counts), whatever the backend's
  // buffers are. Also bounded by the timeout.
  virtual double host_max(double value) = 0;
  virtual int64_t host_sum(int64_t value) = 0;
  // recv (host, size()*bytes) gets every rank's `bytes` host bytes in rank order.
  virtual void host_all_gather(const void* send, void* recv, size_t bytes) = 0;

  // A new communicator over the ranks of this one that pass the same `color` (>= 0), ordered by
  // `key` (ties by rank here), on the same backend and device, with these options. Collective:
  // every rank calls it, after a barrier that is bounded by the timeout like any collective.
  // dist/mesh.h builds the dp and cp axes with it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  const Options& options() const { return options_; }
  void set_timeout(double seconds);

 protected:
  explicit Communicator(Options options) : options_(options) {}
  // Checks a _v call's counts (one per rank) and returns the elements before this rank's block;
  // *total (when given) gets their sum. Throws zaya::Error naming `what` otherwise.
  size_t block_offset(std::span<const size_t> counts, const char* what, size_t* total = nullptr) const;
  Options options_;
};

// The launcher's world size and rank from the environment (OpenMPI, PMIx, PMI, Slurm); 1 and 0 when
// not launched under one. Needs no MPI init. Slurm's world is the job step's task count
// (SLURM_STEP_NUM_TASKS, which srun sets in each task), never the allocation's SLURM_NTASKS: a
// batch script or an salloc shell of an N-task job carries SLURM_NTASKS = N but is one process.
int launcher_world_size();
int launcher_rank();

// A world of one. Collectives copy send to recv (or do nothing in place).
std::unique_ptr<Communicator> make_local_communicator(Options options = {});
// Initializes MPI (once per process) and wraps MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_mpi_communicator(Options options = {});
// NCCL over all MPI ranks, one GPU per rank (local rank modulo the visible devices). Throws in
// builds without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(Options options = {});
// auto: local for a world of one, else nccl when built with CUDA and a GPU is visible, else mpi.
std::unique_ptr<Communicator> make_communicator(Backend backend, bool is_auto, Options options = {});

}  // namespace zaya::dist
