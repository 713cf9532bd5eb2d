#include "zaya/core/threads.h"

#include <omp.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

extern "C" void openblas_set_num_threads(int);

namespace zaya {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// A launcher's variable that must hold a non-negative integer.
int env_count(const char* name, const char* value) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value, &end, 10);
  ZAYA_CHECK(end != value && *end == '\0' && errno == 0 && n >= 0 && n <= 1 << 24, name,
             ": expected a non-negative integer from the launcher, found '", value, "'");
  return static_cast<int>(n);
}

// Slurm's per-node task counts, "2(x3),1" = 2, 2, 2, 1 (one entry per node of the step), entry
// `node`; `name` is the variable it came from. The whole list is checked, not just the entry.
int slurm_tasks_on_node(const char* name, const std::string& text, int node) {
  auto bad = [&](const std::string& why) {
    return Error(str(name, ": ", why, " in '", text, "' (expected counts like 2(x3),1)"));
  };
  int seen = 0, found = -1;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t paren = item.find('(');
    const int tasks = env_count(name, item.substr(0, paren).c_str());
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
        throw bad("malformed repeat");
      repeat = env_count(name, item.substr(paren + 2, item.size() - paren - 3).c_str());
    }
    if (found < 0 && node < seen + repeat) found = tasks;
    seen += repeat;
    at = comma + 1;
  }
  if (found < 0) throw bad(str("no entry for node ", node, " (SLURM_NODEID) among ", seen, " nodes"));
  return found;
}

}  // namespace

int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

LocalRanks launcher_local_ranks() {
  // Pairs of (local rank, local size) that MPI launchers export to every process they start.
  struct Pair {
    const char* rank;
    const char* size;
  };
  for (const Pair& p : {Pair{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},  // OpenMPI
                        Pair{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},  // MPICH Hydra, Intel MPI
                        Pair{"MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"}}) {  // MVAPICH2
    const char* r = env(p.rank);
    const char* n = env(p.size);
    if (!r && !n) continue;
    ZAYA_CHECK(r && n, "the launcher set ", r ? p.rank : p.size, " but not ", r ? p.size : p.rank);
    LocalRanks out{env_count(p.rank, r), env_count(p.size, n), str(p.rank, "/", p.size)};
    ZAYA_CHECK(out.size >= 1 && out.rank < out.size, p.rank, " = ", out.rank, " is not a rank among ", p.size,
               " = ", out.size);
    return out;
  }
  // Slurm: only the tasks of a job step (what srun starts) are ranks. A batch script or an salloc
  // shell also carries SLURM_LOCALID and the allocation's SLURM_TASKS_PER_NODE, but it is one
  // process, so without the step's SLURM_STEP_TASKS_PER_NODE the process is alone on its host.
  // The step's per-node counts ("2(x3),1") at SLURM_NODEID give the tasks sharing this node.
  const char* id = env("SLURM_LOCALID");
  const char* per_node = env("SLURM_STEP_TASKS_PER_NODE");
  if (id && per_node) {
    const char* node_text = env("SLURM_NODEID");
    const int node = node_text ? env_count("SLURM_NODEID", node_text) : 0;
    LocalRanks out{env_count("SLURM_LOCALID", id), slurm_tasks_on_node("SLURM_STEP_TASKS_PER_NODE", per_node, node),
                   "SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE"};
    ZAYA_CHECK(out.size >= 1 && out.rank < out.size, "SLURM_LOCALID = ", out.rank,
               " is not a rank among the ", out.size, " tasks on this node (", out.source, ")");
    return out;
  }
  return {};
}

int default_threads_per_rank() { return std::max(1, hardware_threads() / launcher_local_ranks().size); }

std::string openmp_wait_policy() {
  // As libgomp resolves them: GOMP_SPINCOUNT, when set, decides how long a waiting thread spins;
  // otherwise OMP_WAIT_POLICY does (PASSIVE: not at all, ACTIVE: practically forever).
  if (const char* spin = env("GOMP_SPINCOUNT")) return std::strcmp(spin, "0") == 0 ? "passive" : "default";
  if (const char* policy = env("OMP_WAIT_POLICY")) {
    if (strcasecmp(policy, "passive") == 0) return "passive";
    if (strcasecmp(policy, "active") == 0) return "active";
  }
  return "default";
}

bool oversubscribed(int threads, const LocalRanks& local) {
  return static_cast<int64_t>(local.size) * threads > hardware_threads();
}

void restart_with_passive_openmp_if_oversubscribed(int threads, char** argv) {
  // One thread per rank never waits for a teammate, so spinning cannot steal a core.
  if (threads <= 1 || env("OMP_WAIT_POLICY") || env("GOMP_SPINCOUNT")) return;
  const LocalRanks local = launcher_local_ranks();
  if (!oversubscribed(threads, local)) return;
  log_debug("restarting with OMP_WAIT_POLICY=PASSIVE: ", local.size, " ranks x ", threads, " threads on ",
            hardware_threads(), " hardware threads");
  std::fflush(stdout);
  std::fflush(stderr);
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
  const int err = errno;
  // Still the image whose OpenMP runtime read the old environment: say so, and do not let the
  // variable claim a policy that is not in effect.
  unsetenv("OMP_WAIT_POLICY");
  log_warn("could not restart with OMP_WAIT_POLICY=PASSIVE (execv: ", std::strerror(err), "); ", local.size,
           " ranks x ", threads, " threads exceed the ", hardware_threads(),
           " hardware threads and OpenMP threads will spin while they wait");
}

std::string rank_threads_summary(int rank, int world, int threads) {
  const LocalRanks local = launcher_local_ranks();
  return str("rank ", rank, " of ", world, " (local ", local.rank, " of ", local.size, " on this host",
             local.source.empty() ? "" : ", from " + local.source, "), ",
             threads, threads == 1 ? " thread" : " threads", ", OpenMP ", openmp_wait_policy(), " wait");
}

int max_num_threads() { return 4 * hardware_threads(); }

int checked_num_threads(int64_t n, const std::string& what) {
  ZAYA_CHECK(n >= 1 && n <= max_num_threads(), what, ": expected a thread count in [1, ", max_num_threads(),
             "] (4 x the ", hardware_threads(), " hardware threads), found ", n);
  return static_cast<int>(n);
}

int default_num_threads() {
  if (const char* env = std::getenv("ZAYA_THREADS")) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(env, &end, 10);
    ZAYA_CHECK(end != env && *end == '\0' && errno == 0, "ZAYA_THREADS must be a positive integer, found '",
               env, "'");
    return checked_num_threads(n, "ZAYA_THREADS");
  }
  return default_threads_per_rank();
}

void set_num_threads(int n) {
  if (n <= 0) n = default_num_threads();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace zaya
