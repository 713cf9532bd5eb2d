// Shared by the multi-rank checkpoint tests: a set of global tensors and each rank's chunks of it at
// any world size, the boxes a world of any size loads, and a barrier through the file system (the
// checkpoint layer never communicates; its tests order ranks without MPI too).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt_test_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/writer.h"
#include "zaya/core/error.h"

namespace zaya::ckpt::test {

// [lo, hi) of part `i` of `n` rows split over `parts`: ceil-divided, the last ones shorter (or
// empty), as a data-parallel world splits rows or a flat buffer.
inline std::pair<int64_t, int64_t> split_rows(int64_t n, int parts, int i) {
  const int64_t per = (n + parts - 1) / parts;
  const int64_t lo = std::min<int64_t>(i * per, n);
  return {lo, std::min<int64_t>(lo + per, n)};
}

// How a tensor of the test set is spread over a world.
enum class Spread {
  rows,       // split by rows over every rank (a ZeRO-1 range of a flat buffer when 1-D)
  rank0,      // held whole by rank 0 only (replicated state that only rank 0 saves)
  owner,      // held whole by rank 1 % world (a Muon matrix's momentum, kept by its owner)
  first_two,  // split by rows over ranks 0 and 1 only (rank 2 and later hold none of it)
};

struct GlobalTensor {
  std::string name;
  Tensor whole;
  Spread spread;
};

// The tensors every multi-rank test saves: 1-D and 2-D, every dtype class, a scalar, and tensors
// held by only some of the ranks. `seed` changes every value (a later step saves other bytes).
inline std::vector<GlobalTensor> global_tensors(uint32_t seed) {
  return {{"model.w", patterned({10, 6}, DType::f32, seed + 1), Spread::rows},
          {"optim.flat", patterned({13}, DType::bf16, seed + 2), Spread::rows},
          {"balancer.bias", patterned({5}, DType::f32, seed + 3), Spread::rank0},
          {"state.counter", patterned({}, DType::i64, seed + 4), Spread::rank0},
          {"optim.muon.momentum", patterned({4, 3}, DType::f32, seed + 5), Spread::owner},
          {"loader.order", patterned({9, 2}, DType::i32, seed + 6), Spread::first_two}};
}

// The box of `g` that `rank` of `world` holds; shape empty of rows (hi == lo) when it holds none.
// `held` says whether the rank holds any of it.
inline void box_of(const GlobalTensor& g, int world, int rank, std::vector<int64_t>* offsets,
                   std::vector<int64_t>* shape, bool* held) {
  std::vector<int64_t> full(g.whole.shape().begin(), g.whole.shape().end());
  *offsets = std::vector<int64_t>(full.size(), 0);
  *shape = full;
  switch (g.spread) {
    case Spread::rank0: *held = rank == 0; return;
    case Spread::owner: *held = rank == 1 % world; return;
    case Spread::rows:
    case Spread::first_two: {
      const int parts = g.spread == Spread::rows ? world : std::min(world, 2);
      if (rank >= parts) {
        *held = false;
        return;
      }
      auto [lo, hi] = split_rows(full[0], parts, rank);
      (*offsets)[0] = lo;
      (*shape)[0] = hi - lo;
      *held = hi > lo;
      return;
    }
  }
}

// The items `rank` of `world` saves: its chunk of every tensor it holds (copies, so a test may
// overwrite them after save() to check the snapshot).
inline std::vector<SaveItem> rank_items(const std::vector<GlobalTensor>& set, int world, int rank) {
  std::vector<SaveItem> out;
  for (const auto& g : set) {
    std::vector<int64_t> off, shape;
    bool held = false;
    box_of(g, world, rank, &off, &shape, &held);
    if (!held) continue;
    Tensor part = g.whole.ndim() == 0 ? g.whole.clone() : g.whole.slice(off[0], off[0] + shape[0]).clone();
    std::vector<int64_t> global(g.whole.shape().begin(), g.whole.shape().end());
    out.push_back({g.name, part, global, off});
  }
  return out;
}

// Loads, as rank `rank` of a world of `world` would, every tensor of `set` that the rank's split
// gives it a box of (rows split over the world; the others whole) and compares the bytes exactly:
// resharding copies bytes, so nothing but equality is right. Returns the number of boxes compared.
inline int expect_rank_loads(const Checkpoint& ck, const std::vector<GlobalTensor>& set, int world, int rank) {
  int compared = 0;
  for (const auto& g : set) {
    std::vector<int64_t> full(g.whole.shape().begin(), g.whole.shape().end());
    std::vector<int64_t> off(full.size(), 0), shape = full;
    if (!full.empty()) {  // every tensor with rows is loaded split by rows: a shard of any world size
      auto [lo, hi] = split_rows(full[0], world, rank);
      off[0] = lo;
      shape[0] = hi - lo;
    }
    Tensor got = ck.load_box(g.name, off, shape);
    Tensor want = full.empty() ? g.whole : g.whole.slice(off[0], off[0] + shape[0]).clone();
    EXPECT_TRUE(same_bytes(got, want)) << g.name << " at world " << world << ", rank " << rank;
    ++compared;
  }
  return compared;
}

// A barrier through the file system: each call creates `dir`/b<generation>.<rank> and waits until
// every rank's file of that generation is there. Throws a zaya::Error after `timeout_s`.
class FileBarrier {
 public:
  FileBarrier(std::filesystem::path dir, int rank, int world, double timeout_s = 30)
      : dir_(std::move(dir)), rank_(rank), world_(world), timeout_s_(timeout_s) {
    std::filesystem::create_directories(dir_);
  }
  void operator()() {
    const std::string gen = "b" + std::to_string(generation_++);
    std::ofstream(dir_ / (gen + "." + std::to_string(rank_))) << "here";
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < world_; ++r) {
      while (!std::filesystem::exists(dir_ / (gen + "." + std::to_string(r)))) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s_)
          throw Error(str("test barrier ", gen, ": rank ", r, " never arrived"));
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }

 private:
  std::filesystem::path dir_;
  int rank_, world_;
  double timeout_s_;
  int generation_ = 0;
};

// The names in a committed step directory, sorted.
inline std::vector<std::string> dir_names(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// What a committed checkpoint of `world` ranks must hold: exactly its rank files and the manifest.
inline std::vector<std::string> expected_names(int world) {
  std::vector<std::string> out{"manifest.json"};
  for (int r = 0; r < world; ++r) out.push_back(rank_file_name(r));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace zaya::ckpt::test
