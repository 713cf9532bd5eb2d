// The training data loader: packed, shuffled, blended samples whose whole state is one integer.
//
// - Packing: a dataset's token stream (all documents back to back, EOS-terminated) is cut into
//   samples of seq+1 tokens; sample s is tokens [s·seq, s·seq + seq + 1), so consecutive samples
//   share one token and every token after the first is a target exactly once (Megatron's GPT
//   packing). The last partial sample is dropped: n = (tokens − 1) / seq samples per epoch.
// - Shuffle: within each epoch e of dataset d, samples are visited in a Fisher–Yates permutation
//   drawn from Philox with key mix64(seed + e) ^ mix64(d + 1); epoch e+1 reshuffles.
// - Blending: global sample i comes from the dataset d maximizing w_d·max(i, 1) − count_d (lowest
//   d on a tie; w normalized to sum 1), count_d the samples d has given before i; that dataset
//   gives its count_d-th sample (epoch count_d / n_d, position count_d % n_d). A weight may be 0
//   (at least one positive): that dataset is never picked (a recipe phase that leaves it out).
// - Dataset offsets (set_dataset_offsets): dataset d's count starts at offset_d instead of 0, so
//   a new loader can continue where another left off (the trainer's recipe phases).
// - Data parallel: rank r of W with micro-batch b takes global samples state + r·b + [0, b), and
//   each step advances the state by W·b. sample(i) is a pure function of (datasets, seq, seed, i),
//   so any world size resumes from the same state and sees the same global samples.
// Not thread-safe for concurrent calls on one object (caches are internal); one loader per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/data/indexed_dataset.h"

namespace zaya::data {

struct DatasetSpec {
  std::string prefix;  // PREFIX.bin / PREFIX.idx
  double weight = 1.0;
};

struct SampleLocation {
  int dataset = 0;
  int64_t count = 0;   // samples this dataset gave before this one (across epochs)
  int64_t epoch = 0;   // count / samples_per_epoch
  int64_t sample = 0;  // packed sample index within the dataset, after the shuffle
};

class DataLoader {
 public:
  DataLoader(const std::vector<DatasetSpec>& specs, int64_t seq_len, uint64_t seed);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept = default;
  DataLoader& operator=(DataLoader&&) noexcept = default;

  int64_t seq_len() const { return seq_len_; }
  int num_datasets() const { return static_cast<int>(datasets_.size()); }
  const IndexedDataset& dataset(int d) const { return *datasets_[d]; }
  double weight(int d) const { return weights_[d]; }  // normalized
  int64_t samples_per_epoch(int d) const { return samples_[d]; }

  SampleLocation locate(int64_t global_index);
  // Writes the seq+1 tokens of global sample `global_index` to out.
  void sample(int64_t global_index, int32_t* out);
  std::vector<int32_t> sample(int64_t global_index);

  // Rows j = 0..b-1 of `out` ([b, seq+1] i32) get global samples state + rank·b + j; then the
  // state advances by world·b (every rank calls this once per step with the same state).
  void next_batch(int rank, int world, Tensor& out);
  int64_t state() const { return state_; }
  void set_state(int64_t next_global_index);

  // Per-dataset starting counts (default 0): global sample i takes dataset d's
  // (offset_d + count_d)-th sample. A pure part of the loader's definition, like the weights.
  void set_dataset_offsets(const std::vector<int64_t>& offsets);
  const std::vector<int64_t>& dataset_offsets() const { return offsets_; }
  // offset_d + the samples dataset d gives before global sample i: where a loader that continues
  // this one's stream from sample i should start each dataset.
  std::vector<int64_t> dataset_counts(int64_t global_index);

 private:
  const std::vector<int64_t>& permutation(int d, int64_t epoch);
  void blend_counts_before(int64_t i, std::vector<int64_t>& counts);
  int pick(int64_t i, const std::vector<int64_t>& counts) const;

  std::vector<std::unique_ptr<IndexedDataset>> datasets_;
  std::vector<double> weights_;
  std::vector<int64_t> samples_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t state_ = 0;
  std::vector<int64_t> offsets_;
  // Caches (pure functions of the above): the current epoch's permutation per dataset, and the
  // blend counts every kBlendStride samples so locate() never replays more than one stride.
  std::vector<std::vector<int64_t>> perm_;
  std::vector<int64_t> perm_epoch_;
  std::vector<std::vector<int64_t>> blend_checkpoints_;
  int64_t last_blend_index_ = -1;  // the counts before the last queried sample
  std::vector<int64_t> last_blend_counts_;
};

// The Fisher–Yates permutation of [0, n) for (key): exposed for tests and docs.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t key);

}  // namespace zaya::data
