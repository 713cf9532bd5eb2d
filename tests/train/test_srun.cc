// `srun zaya train` under a real Slurm: the ranks come from the job step (world, rank, and the
// local rank and size that set the threads per rank), MPI wires up through Slurm's PMIx plugin,
// and the run trains the one model that one rank and `mpirun` train — bitwise, in the
// order-independent reduction mode. Also: a batch script that starts zaya without srun is one
// process (not the allocation's N ranks), and a rank killed under srun ends the step with an
// error naming its task, leaving the last checkpoint valid.
//
// Runs only where `srun` exists and a Slurm controller answers (`sinfo` succeeds); otherwise each
// test is skipped with the reason. `scripts/slurm_local.sh start` brings up a one-node Slurm on
// this machine (eval the SLURM_CONF line it prints), and `benchmarks/srun_check.sh` does it all.
// All ranks stay on one node (`-N 1`): the runs' files live in this node's temporary directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"
#include "train/mpi_train_run.h"
#include "train/toy.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

using test_runs::kEnv;
using test_runs::TrainRun;

// Bounds every Slurm command so that a wedged controller fails the test instead of hanging the
// suite; --immediate gives up when the node cannot take the step within the time.
const std::string kSrun = "timeout 300 srun --immediate=60 -N 1 ";

// Why Slurm cannot be used here, or "" when it can.
std::string slurm_unavailable() {
  if (test::run_shell("command -v srun").code != 0) return "srun is not installed";
  const test::CliRun info = test::run_shell("timeout 20 sinfo -h -o '%P %t'");
  if (info.code != 0) {
    std::string why = info.output.substr(0, 300);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    std::replace(why.begin(), why.end(), '\n', ' ');
    return "no Slurm controller answers (sinfo exit " + std::to_string(info.code) + ": " + why + ")";
  }
  return "";
}

class Srun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = slurm_unavailable(); !why.empty())
      GTEST_SKIP() << why << "; scripts/slurm_local.sh start brings up a one-node Slurm (then export SLURM_CONF)";
    root_ = fs::temp_directory_path() / ("zaya_srun_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    prefix_ = toy::make_corpus(root_ / "data");
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  // The config of a run named `name`: `global` micro-batches of one sequence per step over `np`
  // ranks, in the f64 (order-independent) reduction mode; as tests/train/test_data_parallel.cc.
  fs::path config(const std::string& name, int np, int steps, int global = 6, const std::string& ckpt = "") {
    const fs::path cfg = root_ / (name + ".toml");
    std::ofstream(cfg) << toy::model_section() << "[data]\ntrain = [\"" << prefix_ << "\"]\n"
                       << "[train]\nsteps = " << steps << "\nmicro_batch = 1\nseq_len = 16\ngrad_accum = "
                       << global / np << "\neval_every = 0\nprogress = false\nout_dir = \""
                       << (root_ / name).string() << "\"\n"
                       << "[optim]\nlr = 3e-3\nwarmup_steps = 5\ntotal_steps = 50\nbalance_lr = 1e-3\ngrad_clip = 0.5\n"
                       << "muon = true\nmuon_min_dim = 16\n"
                       << (ckpt.empty() ? "[ckpt]\nevery = 0\nsave_final = true\n" : ckpt)
                       << "[parallel]\ngrad_reduce = \"f64\"\nbucket_mb = 0.01\ntimeout_s = 60\n";
    return cfg;
  }
  TrainRun train(const std::string& launch, const std::string& name, int np, int steps) {
    return test_runs::run_training_under(launch, config(name, np, steps), root_ / name);
  }

  fs::path root_;
  std::string prefix_;
};

TEST_F(Srun, TwoAndThreeRanksTrainTheModelOfOneRankAndOfMpirun) {
  const int steps = 20;
  const TrainRun one = train(kEnv, "one", 1, steps);
  ASSERT_EQ(one.rc, 0) << one.out;
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(steps));
  const TrainRun mpirun = train(test_runs::launcher(2), "mpirun2", 2, steps);
  ASSERT_EQ(mpirun.rc, 0) << mpirun.out;
  for (int np : {2, 3}) {
    SCOPED_TRACE(np);
    const std::string n = std::to_string(np);
    const TrainRun s = train(kEnv + kSrun + "-n " + n + " ", "srun" + n, np, steps);
    ASSERT_EQ(s.rc, 0) << s.out;
    // One model over np ranks (not np copies of a one-rank run), each rank placed by Slurm's step.
    EXPECT_NE(s.out.find("world: " + n + " ranks (mpi), mesh dp " + n + " x cp 1"), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("rank 0 of " + n + " (local 0 of " + n +
                         " on this host, from SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE)"),
              std::string::npos)
        << s.out;
    // The f64 mode's gradient sum does not depend on how micro-batches are spread over ranks:
    // bitwise equal, not merely close (test_data_parallel.cc holds mpirun to the same).
    EXPECT_EQ(s.losses, one.losses);
    EXPECT_TRUE(s.params == one.params) << "final parameters differ from the one-rank run in some bit";
    if (np == 2) {
      EXPECT_EQ(s.losses, mpirun.losses);
      EXPECT_TRUE(s.params == mpirun.params) << "final parameters differ from mpirun -np 2's in some bit";
    }
  }
}

// Without --threads each rank takes the node's hardware threads divided by the step's tasks on
// the node (at least one), as the start-up summary says.
TEST_F(Srun, DefaultThreadsPerRankComeFromTheStep) {
  const test::CliRun cores = test::run_shell(kSrun + "-n 1 getconf _NPROCESSORS_ONLN");
  ASSERT_EQ(cores.code, 0) << cores.output;
  const int threads = std::max(1, std::stoi(cores.output) / 2);
  const test::CliRun r = test::run_shell(kEnv + kSrun + "-n 2 " + ZAYA_BINARY + " train --config " +
                                         config("threads", 2, 2).string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(local 0 of 2 on this host, from SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE), " +
                          std::to_string(threads) + (threads == 1 ? " thread," : " threads,")),
            std::string::npos)
      << r.output;
}

// `sbatch -n 2` whose script runs zaya itself: the script is one process, so zaya trains alone
// (the allocation's SLURM_NTASKS = 2 is not its world) and with every hardware thread it asks for.
TEST_F(Srun, ABatchScriptWithoutSrunIsOneProcess) {
  const int steps = 5;
  const TrainRun one = train(kEnv, "one", 1, steps);
  ASSERT_EQ(one.rc, 0) << one.out;
  const fs::path script = root_ / "batch.sh", log = root_ / "batch.log";
  std::ofstream(script) << "#!/bin/bash\nexec " << ZAYA_BINARY << " --threads 1 train --config "
                        << config("batch", 1, steps).string() << "\n";
  TrainRun batch;
  const test::CliRun r = test::run_shell(kEnv + "timeout 300 sbatch --wait -N 1 -n 2 -o " +
                                         log.string() + " " + script.string() + "; cat " + log.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("world: 1 rank (local)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 of 1 (local 0 of 1 on this host), 1 thread"), std::string::npos) << r.output;
  test_runs::read_run(root_ / "batch", batch);
  EXPECT_EQ(batch.losses, one.losses);
  EXPECT_TRUE(batch.params == one.params);
}

// Rank 1 of `srun -n 2` killed (SIGKILL, found by its SLURM_PROCID) after the first checkpoint:
// Slurm's PMIx plugin cancels the step, srun exits non-zero naming the task, and the last
// checkpoint verifies.
TEST_F(Srun, AKilledRankEndsTheStepAndIsNamed) {
  const fs::path cfg = config("killed", 2, 100000, 2, "[ckpt]\nevery = 3\nkeep_last = 2\n");
  const fs::path out = root_ / "killed", log = root_ / "killed.log";
  const std::string script =
      "(" + kEnv + kSrun + "-n 2 " + ZAYA_BINARY + " --threads 1 train --config " + cfg.string() + " > " +
      log.string() + " 2>&1; echo rc=$? >> " + log.string() + ") &\n"
      "for i in $(seq 600); do [ -e " + (out / "latest").string() + " ] && break; sleep 0.1; done\n"
      "victim=''; for p in $(pgrep -f -- '--config " + cfg.string() + "'); do\n"
      "  tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx SLURM_PROCID=1 && victim=$p; done\n"
      "echo victim=$victim\n"
      "kill -KILL $victim\n"
      "wait\n"
      "cat " + log.string() + "\n";
  const test::CliRun r = test::run_shell(script);
  EXPECT_EQ(r.output.find("victim=\n"), std::string::npos) << r.output;  // rank 1's process was found
  EXPECT_NE(r.output.find("rc="), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rc=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("task 1: Killed"), std::string::npos) << r.output;  // srun: error: NODE: task 1: Killed
  const test::CliRun verify = test::run_zaya("ckpt verify " + out.string());
  EXPECT_EQ(verify.code, 0) << verify.output;
}

}  // namespace
}  // namespace zaya::train
