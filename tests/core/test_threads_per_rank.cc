// Threads per rank: the launcher's local rank and size from its environment (set in-process here),
// the default thread count derived from them, OpenMP's wait policy, the restart of the zaya binary
// that makes OpenMP wait passively (checked by what libgomp itself reports), and the local size
// that each child of a real `mpirun -np 2` sees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "scoped_env.h"
#include "test_util.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"

namespace zaya {
namespace {

// Every variable the functions under test read, and the Slurm allocation's, which they must ignore.
const char* const kVars[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "MPI_LOCALRANKID",
                             "MPI_LOCALNRANKS",
                             "MV2_COMM_WORLD_LOCAL_RANK",
                             "MV2_COMM_WORLD_LOCAL_SIZE",
                             "SLURM_LOCALID",
                             "SLURM_NODEID",
                             "SLURM_STEP_TASKS_PER_NODE",
                             "SLURM_TASKS_PER_NODE",
                             "SLURM_NTASKS_PER_NODE",
                             "OMP_WAIT_POLICY",
                             "GOMP_SPINCOUNT",
                             "ZAYA_THREADS"};

// Clears those variables for one test, sets `vars`, and puts the old values back afterwards.
struct Env : test::ScopedEnv {
  explicit Env(const std::map<std::string, std::string>& vars = {}) : ScopedEnv(kVars, vars) {}
};

bool is_launcher_child() { return std::getenv("ZAYA_LOCAL_RANKS_TEST") != nullptr; }

TEST(LocalRanks, WithoutALauncherTheProcessIsAlone) {
  if (is_launcher_child()) GTEST_SKIP() << "the mpirun child runs LauncherChild.* only";
  Env env;
  const LocalRanks l = launcher_local_ranks();
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.size, 1);
  EXPECT_EQ(l.source, "");
  EXPECT_EQ(default_threads_per_rank(), hardware_threads());
  EXPECT_EQ(default_num_threads(), hardware_threads());
}

TEST(LocalRanks, EachMpiLaunchersPair) {
  if (is_launcher_child()) GTEST_SKIP();
  struct Case {
    const char* rank;
    const char* size;
  };
  for (const Case& c : {Case{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                        Case{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                        Case{"MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"}}) {
    Env env({{c.rank, "1"}, {c.size, "2"}});
    const LocalRanks l = launcher_local_ranks();
    EXPECT_EQ(l.rank, 1) << c.rank;
    EXPECT_EQ(l.size, 2) << c.size;
    EXPECT_EQ(l.source, std::string(c.rank) + "/" + c.size);
    EXPECT_EQ(default_threads_per_rank(), std::max(1, hardware_threads() / 2));
    EXPECT_EQ(default_num_threads(), default_threads_per_rank());  // no ZAYA_THREADS
  }
  // mpirun inside a Slurm allocation: the MPI launcher's variables describe the job, Slurm's the
  // allocation.
  Env env({{"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
           {"SLURM_LOCALID", "0"},
           {"SLURM_TASKS_PER_NODE", "1"}});
  EXPECT_EQ(launcher_local_ranks().size, 3);
}

TEST(LocalRanks, SlurmStepTasksPerNodeLists) {
  if (is_launcher_child()) GTEST_SKIP();
  {  // 2(x3),4: nodes 0-2 run 2 tasks, node 3 runs 4.
    Env env({{"SLURM_LOCALID", "3"},
             {"SLURM_NODEID", "3"},
             {"SLURM_STEP_TASKS_PER_NODE", "2(x3),4"},
             {"SLURM_TASKS_PER_NODE", "9"}});
    const LocalRanks l = launcher_local_ranks();
    EXPECT_EQ(l.rank, 3);
    EXPECT_EQ(l.size, 4);  // the step's count, not the job's
    EXPECT_EQ(l.source, "SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE");
  }
  {
    Env env({{"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3),4"}});
    EXPECT_EQ(launcher_local_ranks().size, 2);
  }
  {  // no SLURM_NODEID: node 0
    Env env({{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "5,1"}});
    EXPECT_EQ(launcher_local_ranks().size, 5);
    EXPECT_EQ(default_threads_per_rank(), std::max(1, hardware_threads() / 5));
  }
}

// What `sbatch -n 2` gives its batch script (as `env` printed it there under Slurm 22.05): the
// allocation's counts and a local id, but no job step. The script is one process, alone on its
// host, and gets every hardware thread; before, it took the allocation's 2 tasks for its own.
TEST(LocalRanks, ABatchScriptOutsideAStepIsAlone) {
  if (is_launcher_child()) GTEST_SKIP();
  for (const char* per_node : {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
    Env env({{"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}, {per_node, "2"}});
    const LocalRanks l = launcher_local_ranks();
    EXPECT_EQ(l.rank, 0) << per_node;
    EXPECT_EQ(l.size, 1) << per_node;
    EXPECT_EQ(l.source, "") << per_node;
    EXPECT_EQ(default_threads_per_rank(), hardware_threads()) << per_node;
  }
}

TEST(LocalRanks, MoreRanksThanHardwareThreadsStillGetOne) {
  if (is_launcher_child()) GTEST_SKIP();
  Env env({{"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(4 * hardware_threads())}});
  EXPECT_EQ(default_threads_per_rank(), 1);
}

TEST(LocalRanks, ZayaThreadsStillWins) {
  if (is_launcher_child()) GTEST_SKIP();
  Env env({{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"ZAYA_THREADS", "3"}});
  EXPECT_EQ(default_num_threads(), 3);
}

TEST(LocalRanks, MalformedVariablesAreNamed) {
  if (is_launcher_child()) GTEST_SKIP();
  struct Case {
    std::map<std::string, std::string> vars;
    const char* message;
  };
  const Case cases[] = {
      {{{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
       "the launcher set OMPI_COMM_WORLD_LOCAL_RANK but not OMPI_COMM_WORLD_LOCAL_SIZE"},
      {{{"OMPI_COMM_WORLD_LOCAL_RANK", "x"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
       "OMPI_COMM_WORLD_LOCAL_RANK: expected a non-negative integer from the launcher, found 'x'"},
      {{{"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "2"}},
       "MPI_LOCALRANKID = 2 is not a rank among MPI_LOCALNRANKS = 2"},
      {{{"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "0"}},
       "MPI_LOCALRANKID = 0 is not a rank among MPI_LOCALNRANKS = 0"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3"}},
       "SLURM_STEP_TASKS_PER_NODE: malformed repeat in '2(x3' (expected counts like 2(x3),1)"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2,,1"}},
       "SLURM_STEP_TASKS_PER_NODE: expected a non-negative integer from the launcher, found ''"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}},
       "SLURM_STEP_TASKS_PER_NODE: no entry for node 4 (SLURM_NODEID) among 4 nodes"},
      {{{"SLURM_LOCALID", "x"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}},
       "SLURM_LOCALID: expected a non-negative integer from the launcher, found 'x'"},
      {{{"SLURM_LOCALID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}},
       "SLURM_LOCALID = 2 is not a rank among the 2 tasks on this node "
       "(SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE)"},
  };
  for (const Case& c : cases) {
    Env env(c.vars);
    const std::string message = test::error_of([] { (void)launcher_local_ranks(); });
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "expected '" << c.message << "', got '" << message << "'";
    // The default thread count reports the same error instead of guessing.
    EXPECT_EQ(test::error_of([] { (void)default_num_threads(); }), message);
  }
}

TEST(OpenMpWaitPolicy, AsLibgompResolvesTheVariables) {
  if (is_launcher_child()) GTEST_SKIP();
  auto policy = [](const std::map<std::string, std::string>& vars) {
    Env env(vars);
    return openmp_wait_policy();
  };
  EXPECT_EQ(policy({}), "default");
  EXPECT_EQ(policy({{"OMP_WAIT_POLICY", "passive"}}), "passive");
  EXPECT_EQ(policy({{"OMP_WAIT_POLICY", "ACTIVE"}}), "active");
  EXPECT_EQ(policy({{"GOMP_SPINCOUNT", "0"}}), "passive");
  // GOMP_SPINCOUNT, when set, decides over OMP_WAIT_POLICY.
  EXPECT_EQ(policy({{"OMP_WAIT_POLICY", "PASSIVE"}, {"GOMP_SPINCOUNT", "1000"}}), "default");
}

TEST(OpenMpWaitPolicy, OversubscribedCountsRanksTimesThreads) {
  if (is_launcher_child()) GTEST_SKIP();
  const int hw = hardware_threads();
  EXPECT_FALSE(oversubscribed(hw, LocalRanks{}));
  EXPECT_TRUE(oversubscribed(hw + 1, LocalRanks{}));
  EXPECT_FALSE(oversubscribed(std::max(1, hw / 2), LocalRanks{.rank = 1, .size = 2}));
  EXPECT_TRUE(oversubscribed(hw, LocalRanks{.rank = 1, .size = 2}));
}

TEST(OpenMpWaitPolicy, SummaryLine) {
  if (is_launcher_child()) GTEST_SKIP();
  {
    Env env({{"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"OMP_WAIT_POLICY", "PASSIVE"}});
    EXPECT_EQ(rank_threads_summary(1, 2, 1),
              "rank 1 of 2 (local 1 of 2 on this host, from OMPI_COMM_WORLD_LOCAL_RANK/OMPI_COMM_WORLD_LOCAL_SIZE), "
              "1 thread, OpenMP passive wait");
  }
  {
    Env env({{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "3"}, {"OMP_WAIT_POLICY", "PASSIVE"}});
    EXPECT_EQ(rank_threads_summary(0, 3, 1),
              "rank 0 of 3 (local 0 of 3 on this host, from SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE), 1 thread, "
              "OpenMP passive wait");
  }
  Env env;
  EXPECT_EQ(rank_threads_summary(0, 1, 4),
            "rank 0 of 1 (local 0 of 1 on this host), 4 threads, OpenMP default wait");
}

// ---- The zaya binary restarts itself with OMP_WAIT_POLICY=PASSIVE when the ranks on this host times
// its threads exceed the hardware threads. OMP_DISPLAY_ENV=VERBOSE makes libgomp print the spin
// count it took from the environment when it loaded: 300000 (the default) in the first image, 0 in
// the restarted one. ----

std::string zaya_with(const std::string& env, int threads) {
  // Run with none of the variables that the outer environment (a launcher, the rules' OMP_WAIT_POLICY)
  // might carry, then exactly `env`.
  std::string cmd = "env";
  for (const char* v : kVars) cmd += std::string(" -u ") + v;
  cmd += " OMP_DISPLAY_ENV=VERBOSE " + env + " " + ZAYA_BINARY + " --threads " + std::to_string(threads) +
         " sysinfo";
  return test::run_shell(cmd).output;
}

TEST(OpenMpWaitPolicy, ZayaRestartsWithPassiveWaitWhenOversubscribed) {
  if (is_launcher_child()) GTEST_SKIP();
  const int threads = std::max(2, hardware_threads());  // x 2 local ranks > the hardware threads
  const std::string two = "OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2";
  const std::string out = zaya_with(two, threads);
  const size_t first = out.find("GOMP_SPINCOUNT = '300000'"), restarted = out.find("GOMP_SPINCOUNT = '0'");
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(restarted, std::string::npos) << "the restarted image's libgomp did not take passive waits:\n"
                                          << out;
  EXPECT_LT(first, restarted) << out;
  EXPECT_NE(out.find("zaya threads: " + std::to_string(threads)), std::string::npos) << out;

  // Alone on the host: no restart, libgomp keeps its default.
  const std::string alone = zaya_with("OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1", threads);
  EXPECT_EQ(alone.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << alone;
  // One thread per rank never waits for a teammate: no restart either.
  EXPECT_EQ(zaya_with(two, 1).find("GOMP_SPINCOUNT = '0'"), std::string::npos);
  // The user's own policy is kept.
  const std::string active = zaya_with(two + " OMP_WAIT_POLICY=ACTIVE", threads);
  EXPECT_NE(active.find("GOMP_SPINCOUNT = '30000000000'"), std::string::npos) << active;
  EXPECT_EQ(active.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << active;
}

// ---- Under a real `mpirun -np 2` on this host each child sees local size 2 and its local rank. ----

TEST(LauncherChild, SeesItsLocalRank) {
  if (!is_launcher_child())
    GTEST_SKIP() << "runs only as an mpirun child of LocalRanks.UnderMpirunEachChildSeesTwo";
  const LocalRanks l = launcher_local_ranks();
  std::printf("zaya-local world rank %s: local %d of %d from %s\n", std::getenv("OMPI_COMM_WORLD_RANK"),
              l.rank, l.size, l.source.c_str());
  std::fflush(stdout);
}

TEST(LocalRanks, UnderMpirunEachChildSeesTwo) {
  if (is_launcher_child()) GTEST_SKIP();
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const test::CliRun r = test::run_shell(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -x "
      "ZAYA_LOCAL_RANKS_TEST=1 -np 2 " +
      exe + " --gtest_filter=LauncherChild.* --gtest_brief=1");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int rank : {0, 1})  // one host: the local rank is the world rank
    EXPECT_NE(
        r.output.find("zaya-local world rank " + std::to_string(rank) + ": local " + std::to_string(rank) +
                      " of 2 from OMPI_COMM_WORLD_LOCAL_RANK/OMPI_COMM_WORLD_LOCAL_SIZE"),
        std::string::npos)
        << r.output;
}

}  // namespace
}  // namespace zaya
