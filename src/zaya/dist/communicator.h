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
// - all_reduce and reduce_scatter sum. bf16 sums in fp32 per element and rounds once per
//   pairwise combine (MPI: a custom MPI_Op; NCCL: its native bf16 sum).
// - reduce_scatter(send, recv, recv_count): send holds size()*recv_count elements, rank r receives
//   the sum of block r. In place when recv == send + rank()*recv_count (the rest of send is then
//   unspecified afterwards).
// - all_gather(send, recv, send_count): recv holds size()*send_count elements, block j comes from
//   rank j. In place when send == recv + rank()*send_count.
// - all_to_all(send, recv, count): both hold size()*count elements; block j of send goes to rank
//   j and lands in block rank() of j's recv. In place when send == recv.
// - all_reduce / broadcast are in place when send == recv.
//
// Every collective has a timeout (Options::timeout_s). When it expires the communicator finds which
// ranks never arrived (see docs/dist.md, "Timeouts") and throws CollectiveTimeout naming them; the
// communicator is then broken: every later call throws, and it will not finalize MPI (a finalize
// with a dead peer would hang) — the process should exit non-zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual Backend backend() const = 0;
  virtual Device device() const = 0;  // where collective buffers must live
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype) = 0;
  virtual void all_gather(const void* send, void* recv, size_t send_count, DType dtype) = 0;
  virtual void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) = 0;
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void barrier() = 0;
  // Point-to-point; a send must be matched by a recv of the same count and tag on `peer`.
  virtual void send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual void recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;

  // Control-plane reductions of host scalars (timings, error counts), whatever the backend's
  // buffers are. Also bounded by the timeout.
  virtual double host_max(double value) = 0;
  virtual int64_t host_sum(int64_t value) = 0;
  // recv (host, size()*bytes) gets every rank's `bytes` host bytes in rank order.
  virtual void host_all_gather(const void* send, void* recv, size_t bytes) = 0;

  const Options& options() const { return options_; }
  void set_timeout(double seconds);

 protected:
  explicit Communicator(Options options) : options_(options) {}
  Options options_;
};

// The launcher's world size and rank from the environment (OpenMPI, PMIx, Slurm); 1 and 0 when
// not launched under one. Needs no MPI init.
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
