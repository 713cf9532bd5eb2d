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

// Polls non-blocking MPI work against a deadline. While waiting it answers census queries from
// peers; when the deadline passes it asks every peer "which collective are you in?" over a side
// communicator, waits Options::census_s for answers, and throws CollectiveTimeout naming the
// ranks that stayed silent (dead, hung, or busy outside any collective) and the ranks that are
// waiting in a different collective. See docs/dist.md, "Timeouts".
class Watchdog {
 public:
  explicit Watchdog(MPI_Comm world);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts collective number seq()+1 called `what` (for messages).
  void begin(const char* what);
  // Waits until all `requests` complete (MPI_Testall), or throws.
  void wait(MPI_Request* requests, int n, double timeout_s, double census_s);
  // Waits until done() is true (e.g. a CUDA stream query), or throws. done() is polled.
  void wait_until(const std::function<bool()>& done, double timeout_s, double census_s);

  uint64_t seq() const { return seq_; }
  bool broken() const { return broken_; }
  void check_usable() const;

 private:
  void answer_queries();
  [[noreturn]] void census_and_throw(const std::function<bool()>& done, double timeout_s, double census_s);

  MPI_Comm side_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  uint64_t seq_ = 0;
  std::string what_;
  bool broken_ = false;
  struct Reply {
    MPI_Request request = MPI_REQUEST_NULL;
    uint64_t payload = 0;
  };
  std::list<Reply> replies_;  // census replies we sent that may still be in flight
  std::chrono::steady_clock::time_point last_probe_{};
};

}  // namespace zaya::dist::detail
