// MPI plumbing shared by the mpi and nccl backends: process-wide init/finalize, dtype and op
// mapping, and the Watchdog that turns a collective that never completes into an error naming
// the ranks that never arrived. Internal to the dist layer.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include "zaya/core/dtype.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist::detail {

// MPI_Init_thread(FUNNELED) on first use; MPI_Finalize when the last user releases it, unless
// some communicator was broken by a timeout (finalizing with a dead peer hangs).
void acquire_mpi();
void release_mpi();
void mark_mpi_broken();

MPI_Datatype mpi_datatype(DType t);  // bf16 is a committed 2-byte contiguous type
MPI_Op mpi_sum(DType t);             // MPI_SUM, or the fp32-accumulating bf16 sum

// Numbers the operations of one communicator and waits for them against a deadline. Every rank
// numbers its operations in issue order, so "collective #k" names the same call on every rank.
// While any wait or test of any communicator in the process polls, every live Watchdog answers
// census queries from its peers with the number of the latest operation it has issued. When a
// wait's deadline passes it asks every peer, over a side communicator, for that number, waits
// Options::census_s for answers, and throws CollectiveTimeout naming the ranks that have not issued
// the operation: those that stayed silent (dead, hung, or busy outside any collective) and those
// whose latest operation is an earlier one. See docs/dist.md, "Timeouts".
class Watchdog {
 public:
  explicit Watchdog(MPI_Comm comm);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Numbers the next operation (called `what` in messages) and returns its number.
  uint64_t begin(const char* what);
  // Waits until done() is true (polled), or throws for operation `seq`.
  void wait_until(uint64_t seq, const char* what, const std::function<bool()>& done, double timeout_s,
                  double census_s);
  // done(), answering census queries now and then; never blocks.
  bool poll(const std::function<bool()>& done);
  // The same for MPI requests (MPI_Testall); an MPI error breaks the communicator and throws.
  void wait(uint64_t seq, const char* what, MPI_Request* requests, int n, double timeout_s, double census_s);
  bool test(uint64_t seq, const char* what, MPI_Request* requests, int n);

  uint64_t seq() const { return seq_; }  // the latest operation issued
  bool broken() const { return broken_; }
  void check_usable() const;
  // Answers this communicator's pending census queries (called for every live Watchdog while any
  // of them polls).
  void answer_census();
  // Marks the communicator unusable (and MPI not to be finalized) after an error in `what`.
  void mark_broken(uint64_t seq, const char* what);

 private:
  void answer_queries();
  bool testall(uint64_t seq, const char* what, MPI_Request* requests, int n);
  [[noreturn]] void census_and_throw(uint64_t seq, const char* what, const std::function<bool()>& done,
                                     double timeout_s, double census_s);
  std::string rank_name(int r) const;  // "2", or "2 (world rank 5)" on a sub-communicator

  MPI_Comm side_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_rank_;  // empty when ranks are world ranks
  uint64_t seq_ = 0;
  bool broken_ = false;
  uint64_t broken_seq_ = 0;
  std::string broken_what_;
  struct Reply {
    MPI_Request request = MPI_REQUEST_NULL;
    uint64_t payload = 0;
  };
  std::list<Reply> replies_;  // census replies we sent that may still be in flight
};

}  // namespace zaya::dist::detail
