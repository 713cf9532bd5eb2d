// DataLoader: packing, shuffling, determinism, resume, data-parallel coverage, blending.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "zaya/core/error.h"
#include "zaya/data/indexed_dataset.h"
#include "zaya/data/loader.h"

namespace zaya::data {
namespace {
namespace fs = std::filesystem;

// A dataset whose token stream is base, base+1, ..., base+n-1 in documents of varying length, so
// a token's value says exactly where in the stream it came from.
std::string make_dataset(const std::string& name, int32_t base, int32_t n) {
  // Per process: ctest runs tests in parallel processes, which must not share files.
  const auto dir = fs::temp_directory_path() / "zaya_test_data" / ("loader_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::vector<std::vector<int32_t>> docs;
  int32_t t = 0;
  for (int len = 1; t < n; len = len % 13 + 1) {
    docs.emplace_back();
    for (int k = 0; k < len && t < n; ++k) docs.back().push_back(base + t++);
  }
  const std::string prefix = (dir / name).string();
  write_indexed_dataset(prefix, TokenDtype::u16, docs);
  return prefix;
}

TEST(Loader, PacksSamplesAcrossDocumentsAndDropsThePartialTail) {
  const std::string p = make_dataset("pack", 0, 1003);
  DataLoader dl({{p, 1.0}}, 10, 5);
  EXPECT_EQ(dl.samples_per_epoch(0), 100);  // (1003 - 1) / 10; the tail of 2 tokens is dropped
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 100; ++i) {
    const std::vector<int32_t> s = dl.sample(i);
    ASSERT_EQ(s.size(), 11u);
    const SampleLocation loc = dl.locate(i);
    // Sample k is tokens [10k, 10k + 11): consecutive values, one token shared with sample k+1.
    EXPECT_EQ(s[0], loc.sample * 10);
    for (int j = 1; j < 11; ++j) EXPECT_EQ(s[j], s[0] + j);
    seen.insert(loc.sample);
  }
  EXPECT_EQ(seen.size(), 100u) << "one epoch visits every packed sample exactly once";
  // The shuffle is not the identity.
  int in_place = 0;
  for (int64_t i = 0; i < 100; ++i) in_place += dl.locate(i).sample == i;
  EXPECT_LT(in_place, 10);
}

TEST(Loader, EpochsReshuffle) {
  const std::string p = make_dataset("epochs", 0, 501);
  DataLoader dl({{p, 1.0}}, 10, 5);
  ASSERT_EQ(dl.samples_per_epoch(0), 50);
  std::vector<int64_t> e0, e1;
  for (int64_t i = 0; i < 50; ++i) e0.push_back(dl.locate(i).sample);
  for (int64_t i = 50; i < 100; ++i) {
    EXPECT_EQ(dl.locate(i).epoch, 1);
    e1.push_back(dl.locate(i).sample);
  }
  EXPECT_NE(e0, e1);
  std::sort(e1.begin(), e1.end());
  std::vector<int64_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(e1, all);
}

TEST(Loader, SampleIsAPureFunctionOfSeedAndIndex) {
  const std::string a = make_dataset("pure_a", 0, 2000), b = make_dataset("pure_b", 30000, 3000);
  DataLoader x({{a, 0.3}, {b, 0.7}}, 16, 11), y({{a, 0.3}, {b, 0.7}}, 16, 11),
      z({{a, 0.3}, {b, 0.7}}, 16, 12);
  // Different access orders (y backwards, jumping) give the same samples; another seed differs.
  std::vector<std::vector<int32_t>> forward;
  for (int64_t i = 0; i < 400; ++i) forward.push_back(x.sample(i));
  for (int64_t i = 399; i >= 0; i -= 3) EXPECT_EQ(y.sample(i), forward[i]) << i;
  int same = 0;
  for (int64_t i = 0; i < 400; ++i) same += z.sample(i) == forward[i];
  EXPECT_LT(same, 40);
}

TEST(Loader, ResumeFromStateEqualsContinuing) {
  const std::string a = make_dataset("resume_a", 0, 3000), b = make_dataset("resume_b", 30000, 1000);
  const std::vector<DatasetSpec> specs = {{a, 2.0}, {b, 1.0}};
  DataLoader run(specs, 8, 3);
  Tensor batch = Tensor::empty({4, 9}, DType::i32);
  std::vector<std::vector<int32_t>> continued;
  int64_t saved = -1;
  for (int step = 0; step < 120; ++step) {  // 480 samples: past an epoch of b (111 samples)
    if (step == 50) saved = run.state();
    run.next_batch(0, 1, batch);
    if (step >= 50) continued.emplace_back(batch.data<int32_t>(), batch.data<int32_t>() + 36);
  }
  EXPECT_EQ(saved, 200);
  DataLoader resumed(specs, 8, 3);
  resumed.set_state(saved);
  for (int step = 50; step < 120; ++step) {
    resumed.next_batch(0, 1, batch);
    EXPECT_EQ(std::vector<int32_t>(batch.data<int32_t>(), batch.data<int32_t>() + 36), continued[step - 50]);
  }
  EXPECT_EQ(resumed.state(), run.state());
}

TEST(Loader, AnyWorldSizeCoversTheSameGlobalSamples) {
  const std::string a = make_dataset("dp_a", 0, 4000), b = make_dataset("dp_b", 30000, 2000);
  const std::vector<DatasetSpec> specs = {{a, 1.0}, {b, 1.0}};
  // Global batch 12 = W·b for W = 1, 2, 3; gather each step's rows in rank order.
  auto global_rows = [&](int world) {
    const int b = 12 / world;
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(specs, 16, 9);
    std::vector<std::vector<int32_t>> rows;
    Tensor batch = Tensor::empty({b, 17}, DType::i32);
    for (int step = 0; step < 20; ++step)
      for (int r = 0; r < world; ++r) {
        ranks[r].next_batch(r, world, batch);
        for (int j = 0; j < b; ++j)
          rows.emplace_back(batch.data<int32_t>() + j * 17, batch.data<int32_t>() + (j + 1) * 17);
      }
    return rows;
  };
  const auto w1 = global_rows(1);
  EXPECT_EQ(w1.size(), 240u);
  EXPECT_EQ(global_rows(2), w1);
  EXPECT_EQ(global_rows(3), w1);
}

TEST(Loader, BlendingProportionsConvergeToTheWeights) {
  const std::string a = make_dataset("blend_a", 0, 900), b = make_dataset("blend_b", 10000, 900),
                    c = make_dataset("blend_c", 20000, 900);
  DataLoader dl({{a, 5.0}, {b, 3.0}, {c, 2.0}}, 8, 1);
  std::vector<int64_t> counts(3);
  const int64_t n = 10000;  // several epochs of each dataset, crossing blend checkpoints
  std::vector<SampleLocation> seq;
  for (int64_t i = 0; i < n; ++i) {
    seq.push_back(dl.locate(i));
    ++counts[seq.back().dataset];
  }
  // Random access on a fresh loader (checkpoint strides of 4096, backwards jumps) agrees.
  DataLoader fresh({{a, 5.0}, {b, 3.0}, {c, 2.0}}, 8, 1);
  for (int64_t i : {9999, 4096, 4095, 0, 8191, 8192, 5000, 1}) {
    const SampleLocation l = fresh.locate(i);
    EXPECT_EQ(l.dataset, seq[i].dataset) << i;
    EXPECT_EQ(l.count, seq[i].count) << i;
    EXPECT_EQ(l.sample, seq[i].sample) << i;
  }
  // For these weights the greedy rule keeps every count within one sample of w_d·i (checked on
  // every prefix below); tolerance 2 samples allows for the max(i, 1) start.
  EXPECT_NEAR(static_cast<double>(counts[0]), 0.5 * n, 2.0);
  EXPECT_NEAR(static_cast<double>(counts[1]), 0.3 * n, 2.0);
  EXPECT_NEAR(static_cast<double>(counts[2]), 0.2 * n, 2.0);
  // Tokens come from the dataset the blend picked.
  for (int64_t i = 0; i < 50; ++i) {
    const int d = dl.locate(i).dataset;
    EXPECT_EQ(dl.sample(i)[0] / 10000, d);
  }
  // Every prefix also stays close to its share (the point of "furthest below its target").
  std::vector<int64_t> run(3);
  for (int64_t i = 0; i < 500; ++i) {
    ++run[dl.locate(i).dataset];
    for (int d = 0; d < 3; ++d)
      EXPECT_LE(std::abs(static_cast<double>(run[d]) - dl.weight(d) * (i + 1)), 1.0 + 1e-9);
  }
}

TEST(Loader, ShuffledIndicesArePermutations) {
  for (int64_t n : {1, 2, 7, 1000}) {
    std::vector<int64_t> p = shuffled_indices(n, 42);
    EXPECT_EQ(p, shuffled_indices(n, 42));
    std::sort(p.begin(), p.end());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(p[i], i);
  }
}

TEST(Loader, BadConfigurationsAreErrors) {
  const std::string a = make_dataset("bad", 0, 100);
  EXPECT_THROW(DataLoader({}, 8, 1), Error);
  EXPECT_THROW(DataLoader({{a, 0.0}}, 8, 1), Error);
  EXPECT_THROW(DataLoader({{a, 1.0}}, 100, 1), Error);  // 100 tokens cannot fill 101
  DataLoader dl({{a, 1.0}}, 8, 1);
  Tensor wrong = Tensor::empty({2, 8}, DType::i32);
  EXPECT_THROW(dl.next_batch(0, 1, wrong), Error);
  Tensor ok = Tensor::empty({2, 9}, DType::i32);
  EXPECT_THROW(dl.next_batch(2, 2, ok), Error);
}

}  // namespace
}  // namespace zaya::data
