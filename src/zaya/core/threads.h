// One thread-count setting for everything that spawns threads: OpenMP (our kernels and oneDNN,
// which Debian builds on OpenMP) and OpenBLAS.
#pragma once

#include <cstdint>
#include <string>

namespace zaya {

// Sets the thread count for OpenMP, oneDNN and OpenBLAS. n <= 0 means "all hardware threads".
void set_num_threads(int n);
int num_threads();
// Thread count to use when none is configured: $ZAYA_THREADS if set (checked by
// checked_num_threads), else default_threads_per_rank().
int default_num_threads();

// The hardware threads of this host (std::thread::hardware_concurrency, at least 1).
int hardware_threads();

// Where this process sits among the ranks the launcher started on its host, from the launcher's
// environment (OpenMPI, MPICH/Hydra and Intel MPI, MVAPICH2, Slurm; see docs/dist.md, "Threads per
// rank"); rank 0 of 1 without a launcher. Slurm's variables count only in a job step (srun's tasks):
// a batch script or an salloc shell is one process, alone. Needs no MPI. A variable that is set but malformed, or a
// rank outside its size, is a zaya::Error naming the variable.
struct LocalRanks {
  int rank = 0;        // this process's index among the ranks on this host
  int size = 1;        // the ranks on this host
  std::string source;  // the variables they came from; empty without a launcher
};
LocalRanks launcher_local_ranks();

// Ranks on one host share its cores: max(1, hardware threads / ranks on this host).
int default_threads_per_rank();

// OpenMP's wait policy as the runtime took it from the environment when it loaded: "passive"
// (OMP_WAIT_POLICY=PASSIVE, or GOMP_SPINCOUNT=0), "active", or "default" (spin a while, then sleep).
std::string openmp_wait_policy();

// Whether this host's ranks x `threads` exceed its hardware threads. Spinning OpenMP threads then
// steal the cores the other ranks' threads need (with 2 threads per rank on 2 busy cores `eval`
// ran 4-20x slower than with 1), so they must sleep when they wait.
bool oversubscribed(int threads, const LocalRanks& local);

// Makes OpenMP wait passively when oversubscribed(threads, local) and the user set neither
// OMP_WAIT_POLICY nor GOMP_SPINCOUNT. libgomp reads both once, in its own constructor, before main
// runs, so setting them later changes nothing: this sets OMP_WAIT_POLICY=PASSIVE and re-executes
// the program (execv of /proc/self/exe with argv: same process id, arguments and environment plus
// that variable). main calls it as soon as the thread count is known, before MPI, CUDA or any
// thread starts. Returns when no restart is needed, or when execv failed (logged; the run goes on
// with spinning waits).
void restart_with_passive_openmp_if_oversubscribed(int threads, char** argv);

// The start-up summary's line, e.g. "rank 1 of 2 (local 1 of 2 on this host, from
// SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE), 1 thread, OpenMP passive wait": the launcher's variables
// are named so that a run shows where its threads per rank came from.
std::string rank_threads_summary(int rank, int world, int threads);

// The most threads a user may ask for: 4 × the hardware threads. More only oversubscribes the
// cores, and far more breaks the runtimes: every OpenMP thread reserves a stack, and libgomp
// crashes or exhausts memory when asked for tens of thousands.
int max_num_threads();
// A user's thread count n from `what` ("--threads", "ZAYA_THREADS"): n itself when it is in
// [1, max_num_threads()], else a zaya::Error naming `what`, the range and n.
int checked_num_threads(int64_t n, const std::string& what);

}  // namespace zaya
