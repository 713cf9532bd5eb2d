// Shared by the supervisor tests that drive the real `zaya train` on the toy model: the run
// config, launch commands, a run's final weights, and undisturbed reference runs cached once per
// build of the binary for every test process (ctest runs each test case as a process of its own).
#pragma once

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/toy.h"
#include "zaya/ckpt/reader.h"
#include "zaya/model/params.h"

namespace zaya::aegis::testing {
namespace fs = std::filesystem;

inline const std::string kEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE ";

// Every weight of the final checkpoint of `run`, in weight_shapes order.
inline std::vector<float> final_weights(const fs::path& run) {
  ckpt::Checkpoint c(run);
  std::vector<float> all;
  const auto cfg = model::ModelConfig::from_hf_json_text(c.manifest().state["model_config"].dump(), "");
  for (const auto& [name, shape] : model::weight_shapes(cfg)) {
    const Tensor t = c.load_full(name);
    all.insert(all.end(), t.data<float>(), t.data<float>() + t.numel());
  }
  return all;
}

// A toy run: `steps` steps of a global batch of 2 sequences at `np` ranks, a checkpoint every
// `every` (all kept, so that a rewind finds the one it wants). A NaN stops the run at once
// (max_skipped_steps = 1, exit 4) so that the supervisor sees it. Collectives time out after 30 s:
// long enough for a loaded machine, and longer than the hang timeouts the tests give the supervisor.
// `extra` is appended to [train]. Only out_dir and the corpus path differ between tests.
inline std::string toy_run_config(const std::string& corpus, const fs::path& out, int np, int steps, int every,
                                  const std::string& extra = "") {
  return train::toy::model_section() + "[data]\ntrain = [\"" + corpus + "\"]\n[train]\nsteps = " +
         std::to_string(steps) + "\nmicro_batch = 1\nseq_len = 16\ngrad_accum = " + std::to_string(2 / np) +
         "\neval_every = 0\nprogress = false\nmax_skipped_steps = 1\n" + extra + "out_dir = \"" + out.string() +
         "\"\n[optim]\nlr = 3e-3\nwarmup_steps = 5\ntotal_steps = 1000\nbalance_lr = 1e-3\n"
         "[ckpt]\nevery = " +
         std::to_string(every) + "\nkeep_last = 1000\nsave_final = true\n[parallel]\ntimeout_s = 30\n";
}

inline std::string train_command(const fs::path& cfg, int np) {
  return (np == 1 ? std::string() : "mpirun --oversubscribe -np " + std::to_string(np) + " ") + ZAYA_BINARY +
         " --threads 1 train --config " + cfg.string();
}

// Identity of the built binary: a rebuild invalidates cached references.
inline std::string binary_identity() {
  struct stat s {};
  ::stat(ZAYA_BINARY, &s);
  return std::to_string(s.st_size) + "." + std::to_string(s.st_mtim.tv_sec) + "." + std::to_string(s.st_mtim.tv_nsec);
}

// The final weights of an undisturbed run, computed once per (binary, `key`) and kept under the
// build directory (next to the binary, test_cache/, where an earlier build's are removed);
// concurrent test processes wait on a file lock for the first to compute it. `make(dir)` runs the reference inside `dir` and returns its weights.
inline std::vector<float> cached_reference(const std::string& key,
                                           const std::function<std::vector<float>(const fs::path&)>& make) {
  const fs::path cache = fs::path(ZAYA_BINARY).parent_path() / "test_cache";
  fs::create_directories(cache);
  const std::string build = "aegis_ref_" + std::to_string(std::hash<std::string>{}(binary_identity())) + "_";
  const std::string name = build + std::to_string(std::hash<std::string>{}(key));
  const int lock = ::open((cache / (name + ".lock")).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  const fs::path file = cache / (name + ".f32");
  std::vector<float> w;
  if (fs::exists(file)) {
    w.resize(fs::file_size(file) / sizeof(float));
    std::ifstream(file, std::ios::binary).read(reinterpret_cast<char*>(w.data()), static_cast<std::streamsize>(fs::file_size(file)));
  } else {
    // References of earlier builds of the binary are never read again.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cache, ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("aegis_ref_", 0) == 0 && f.rfind(build, 0) != 0) fs::remove_all(e.path(), ec);
    }
    const fs::path dir = cache / (name + ".run");
    fs::remove_all(dir);
    w = make(dir);
    fs::remove_all(dir);
    if (!w.empty()) {
      const fs::path tmp = cache / (name + ".f32.tmp");
      std::ofstream(tmp, std::ios::binary).write(reinterpret_cast<const char*>(w.data()),
                                                 static_cast<std::streamsize>(w.size() * sizeof(float)));
      fs::rename(tmp, file);
    }
  }
  if (lock >= 0) ::close(lock);  // releases the lock
  return w;
}

// The final weights of an undisturbed toy_run_config run, cached (above) for every test process.
inline std::vector<float> undisturbed_weights(int np, int steps, int every, const std::string& extra = "",
                                              const std::string& options = "") {
  const std::string key = "toy|" + toy_run_config("CORPUS", "OUT", np, steps, every, extra) + "|" + options;
  return cached_reference(key, [&](const fs::path& dir) {
    fs::create_directories(dir);
    const std::string corpus = train::toy::make_corpus(dir / "data");
    const fs::path cfg = dir / "ref.toml";
    std::ofstream(cfg) << toy_run_config(corpus, dir / "ref", np, steps, every, extra);
    const test::CliRun r = test::run_shell(kEnv + train_command(cfg, np) + " " + options);
    if (r.code != 0) {
      ADD_FAILURE() << "the undisturbed reference run failed:\n" << r.output;
      return std::vector<float>{};
    }
    return final_weights(dir / "ref");
  });
}

// The seed of this test process's random fault steps: ZAYA_AEGIS_SEED when set (to reproduce a
// failure), else drawn; printed either way.
inline uint64_t fault_seed() {
  static const uint64_t seed = [] {
    const char* v = std::getenv("ZAYA_AEGIS_SEED");
    const uint64_t s = v && *v ? std::stoull(v) : std::random_device{}();
    std::cout << "fault steps seeded with ZAYA_AEGIS_SEED=" << s << " (set it to reproduce this run)" << std::endl;
    return s;
  }();
  return seed;
}

}  // namespace zaya::aegis::testing
