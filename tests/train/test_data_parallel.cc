// Data-parallel training against one rank: the real `zaya train` under `mpirun --oversubscribe`
// at N = 2 and 3 with the same global batch as one rank (grad_accum = 6 / N micro-batches of one
// sequence per rank), in the order-independent reduction mode (parallel.grad_reduce = "f64"):
// 50 steps of per-step losses and the final parameters within 1e-5 relative of the one-rank run —
// and, as that mode promises, bitwise equal. Also: the same N twice is bitwise identical in the
// default f32 mode, and a world that does not fit the batch is refused at start.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/ckpt/reader.h"
#include "zaya/model/params.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;

const std::string kEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE ";
std::string launcher(int np) {
  return np == 1 ? kEnv : kEnv + "mpirun --oversubscribe -np " + std::to_string(np) + " ";
}

struct TrainRun {
  int rc = -1;
  std::string out;
  std::vector<double> losses;
  std::vector<float> params;  // every weight of the final checkpoint, in weight_shapes order
};

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_dp_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    prefix_ = toy::make_corpus(root_ / "data");
  }
  void TearDown() override { fs::remove_all(root_); }

  // `global` micro-batches of one sequence per step over `np` ranks.
  TrainRun train(int np, const std::string& name, int steps, const std::string& reduce, int global = 6) {
    const fs::path out = root_ / name;
    const fs::path cfg = root_ / (name + ".toml");
    std::ofstream(cfg) << toy::model_section() << "[data]\ntrain = [\"" << prefix_ << "\"]\n"
                       << "[train]\nsteps = " << steps << "\nmicro_batch = 1\nseq_len = 16\ngrad_accum = "
                       << global / np << "\neval_every = 0\nprogress = false\nout_dir = \"" << out.string() << "\"\n"
                       << "[optim]\nlr = 3e-3\nwarmup_steps = 5\nbalance_lr = 1e-3\ngrad_clip = 0.5\nmuon = true\nmuon_min_dim = 16\n"
                       << "[ckpt]\nevery = 0\nsave_final = " << (std::getenv("TMP_NOSAVE") ? "false" : "true") << "\n"
                       << "[parallel]\ngrad_reduce = \"" << reduce << "\"\nbucket_mb = 0.01\ntimeout_s = 60\n";
    TrainRun r;
    const test::CliRun run =
        test::run_shell(launcher(np) + ZAYA_BINARY + " --threads 1 train --config " + cfg.string());
    r.rc = run.code;
    r.out = run.output;
    if (r.rc != 0) return r;
    std::ifstream metrics(out / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) r.losses.push_back(j["loss"].get<double>());
    }
    if (std::getenv("TMP_NOSAVE")) return r;
    ckpt::Checkpoint c(out);
    for (const auto& [wname, shape] : model::weight_shapes(c.manifest().state.contains("model_config")
                                                                ? model::ModelConfig::from_hf_json_text(
                                                                      c.manifest().state["model_config"].dump(), "")
                                                                : model::ModelConfig{})) {
      const Tensor t = c.load_full(wname);
      const float* p = t.data<float>();
      r.params.insert(r.params.end(), p, p + t.numel());
    }
    return r;
  }

  fs::path root_;
  std::string prefix_;
};

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// The worst relative difference of a against the reference b, over elements with |b| above a floor
// (parameters near zero are compared absolutely against the floor).
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / std::max(std::abs(double(b[i])), 1e-3));
  return worst;
}

TEST_F(DataParallel, TwoAndThreeRanksTrainTheOneRankModel) {
  const int steps = 50;
  const TrainRun one = train(1, "n1", steps, "f64");
  ASSERT_EQ(one.rc, 0) << one.out;
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(steps));
  for (int np : {2, 3}) {
    SCOPED_TRACE(np);
    const TrainRun n = train(np, std::to_string(np) + "ranks", steps, "f64");
    ASSERT_EQ(n.rc, 0) << n.out;
    ASSERT_EQ(n.losses.size(), one.losses.size());
    // Tolerance 1e-5 relative (the bound); the f64 mode makes the gradient sum independent
    // of how micro-batches are spread over ranks, so the runs are in fact expected bitwise equal.
    size_t differing = 0;
    for (size_t s = 0; s < one.losses.size(); ++s) {
      EXPECT_LE(rel(n.losses[s], one.losses[s]), 1e-5) << "step " << s + 1;
      differing += n.losses[s] != one.losses[s];
    }
    ASSERT_EQ(n.params.size(), one.params.size());
    EXPECT_LE(max_rel(n.params, one.params), 1e-5);
    EXPECT_EQ(differing, 0u) << "losses of " << differing << " steps differ in some bit";
    EXPECT_TRUE(n.params == one.params) << "final parameters differ in some bit";
  }
}

TEST_F(DataParallel, SameWorldTwiceIsBitwiseIdenticalInF32Mode) {
  const TrainRun a = train(2, "a", 8, "f32"), b = train(2, "b", 8, "f32");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_TRUE(a.params == b.params);
}

TEST_F(DataParallel, WorldThatDoesNotMatchTheMeshIsRefused) {
  const fs::path cfg = root_ / "bad.toml";
  std::ofstream(cfg) << toy::model_section() << "[data]\ntrain = [\"" << prefix_ << "\"]\n"
                     << "[train]\nsteps = 2\nmicro_batch = 1\nseq_len = 16\nout_dir = \"" << (root_ / "bad").string()
                     << "\"\n[optim]\nwarmup_steps = 1\n[parallel]\ndp = 3\n";
  const test::CliRun r = test::run_shell(launcher(2) + ZAYA_BINARY + " --threads 1 train --config " + cfg.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("parallel.dp x parallel.cp = 3 x 1 = 3 ranks, but this process was launched in a world of 2"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace zaya::train
