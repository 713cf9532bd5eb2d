// Shared by the multi-rank trainer tests: the real `zaya train` under `mpirun --oversubscribe`
// (or alone for one rank, or under another launcher such as srun), and what a run left: its exit
// code and output, each step's loss from metrics.jsonl and every weight of its final checkpoint.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/model/config.h"
#include "zaya/model/params.h"

namespace zaya::train::test_runs {

inline const std::string kEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE ";
inline std::string launcher(int np) {
  return np == 1 ? kEnv : kEnv + "mpirun --oversubscribe -np " + std::to_string(np) + " ";
}

struct TrainRun {
  int rc = -1;
  std::string out;
  std::vector<double> losses;
  std::vector<float> params;  // every weight of the final checkpoint, in weight_shapes order
};

// What the finished run in `out` left: each step's loss and every weight of its final checkpoint.
inline void read_run(const std::filesystem::path& out, TrainRun& r) {
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) r.losses.push_back(j["loss"].get<double>());
  }
  ckpt::Checkpoint c(out);
  const std::string config = c.manifest().state["model_config"].dump();
  for (const auto& [name, shape] : model::weight_shapes(model::ModelConfig::from_hf_json_text(config, ""))) {
    const Tensor t = c.load_full(name);
    r.params.insert(r.params.end(), t.data<float>(), t.data<float>() + t.numel());
  }
}

// `launch` (variable assignments and a launcher command, e.g. "srun -n 2 ") + `zaya --threads 1
// train --config cfg extra`, whose run directory is `out`.
inline TrainRun run_training_under(const std::string& launch, const std::filesystem::path& cfg,
                                   const std::filesystem::path& out, const std::string& extra = "") {
  TrainRun r;
  const test::CliRun run =
      test::run_shell(launch + ZAYA_BINARY + " --threads 1 train --config " + cfg.string() + " " + extra);
  r.rc = run.code;
  r.out = run.output;
  if (r.rc == 0) read_run(out, r);
  return r;
}

// `env` (variable assignments) + the launcher for `np` ranks (mpirun, or none for one).
inline TrainRun run_training(const std::string& env, int np, const std::filesystem::path& cfg,
                             const std::filesystem::path& out, const std::string& extra = "") {
  return run_training_under(env + launcher(np), cfg, out, extra);
}

}  // namespace zaya::train::test_runs
