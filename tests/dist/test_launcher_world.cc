// The launcher's world size and rank from the environment (set in-process here): each launcher's
// variables, their order, and Slurm's job step against its allocation — a batch script or an
// salloc shell of an N-task job carries SLURM_NTASKS = N but is one process, while srun's tasks
// carry the step's SLURM_STEP_NUM_TASKS. The variable sets are those Slurm 22.05 exported to a
// batch script and to srun's tasks (scripts/slurm_local.sh; tests/train/test_srun.cc runs the
// real thing where a Slurm controller answers).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "scoped_env.h"
#include "communicator_test_util.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist {
namespace {

// Every variable launcher_world_size() and launcher_rank() read, and the allocation's, which they
// must ignore.
const char* const kVars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_SIZE",
                             "PMIX_RANK",            "PMI_SIZE",             "PMI_RANK",
                             "SLURM_STEP_NUM_TASKS", "SLURM_PROCID",         "SLURM_NTASKS",
                             "SLURM_NPROCS",         "SLURM_LOCALID",        "SLURM_TASKS_PER_NODE"};

// Clears those variables for one test, sets `vars`, and puts the old values back afterwards.
struct Env : test::ScopedEnv {
  explicit Env(const std::map<std::string, std::string>& vars = {}) : ScopedEnv(kVars, vars) {}
};

TEST(LauncherWorld, WithoutALauncherAWorldOfOne) {
  if (test_support::is_mpi_child()) GTEST_SKIP() << "the mpirun children run MpiSelf.* only";
  Env env;
  EXPECT_EQ(launcher_world_size(), 1);
  EXPECT_EQ(launcher_rank(), 0);
}

TEST(LauncherWorld, EachLaunchersVariables) {
  if (test_support::is_mpi_child()) GTEST_SKIP();
  {
    Env env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}});
    EXPECT_EQ(launcher_world_size(), 4);
    EXPECT_EQ(launcher_rank(), 3);
  }
  {
    Env env({{"PMI_SIZE", "3"}, {"PMI_RANK", "2"}});
    EXPECT_EQ(launcher_world_size(), 3);
    EXPECT_EQ(launcher_rank(), 2);
  }
  {  // mpirun inside an srun task: the MPI launcher's world is the job's
    Env env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"SLURM_STEP_NUM_TASKS", "1"},
             {"SLURM_PROCID", "0"}});
    EXPECT_EQ(launcher_world_size(), 2);
    EXPECT_EQ(launcher_rank(), 1);
  }
}

// Task 1 of `srun -n 2` (srun with --mpi=pmix also sets PMIX_RANK, but no PMIX_SIZE).
TEST(LauncherWorld, AnSrunTaskIsARankOfTheStep) {
  if (test_support::is_mpi_child()) GTEST_SKIP();
  Env env({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NPROCS", "2"},
           {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "2"}, {"PMIX_RANK", "1"}});
  EXPECT_EQ(launcher_world_size(), 2);
  EXPECT_EQ(launcher_rank(), 1);
  // `srun -n 1` inside a 3-task allocation: the step has one task, whatever the allocation holds.
  Env one({{"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}});
  EXPECT_EQ(launcher_world_size(), 1);
}

// The batch script of `sbatch -n 2` (and an `salloc -n 2` shell): one process. Taking SLURM_NTASKS
// for the world made `zaya train` there expect a second rank that never comes ("process mesh: dp x
// cp = 2 x 1 = 2 ranks, but the world has 1").
TEST(LauncherWorld, ABatchScriptOfAnNTaskJobIsAWorldOfOne) {
  if (test_support::is_mpi_child()) GTEST_SKIP();
  Env env({{"SLURM_NTASKS", "2"}, {"SLURM_NPROCS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
           {"SLURM_TASKS_PER_NODE", "2"}});
  EXPECT_EQ(launcher_world_size(), 1);
  EXPECT_EQ(launcher_rank(), 0);
}

}  // namespace
}  // namespace zaya::dist
