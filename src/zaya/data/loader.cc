#include "zaya/data/loader.h"

#include <cmath>
#include <numeric>

#include "zaya/core/error.h"
#include "zaya/core/philox.h"
#include "zaya/data/hash.h"

namespace zaya::data {
namespace {

constexpr int64_t kBlendStride = 4096;

}  // namespace

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t key) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  // Fisher–Yates from the back: step k (swap position i = n-1-k) draws 64 bits from Philox block
  // k (lanes 0 and 1) and maps them to [0, i] by a 128-bit multiply (bias < (i+1)/2^64).
  for (int64_t i = n - 1; i > 0; --i) {
    PhiloxBlock b = philox_block(key, static_cast<uint64_t>(n - 1 - i));
    const uint64_t r = (static_cast<uint64_t>(b.v[1]) << 32) | b.v[0];
    const int64_t j =
        static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(p[i], p[j]);
  }
  return p;
}

DataLoader::DataLoader(const std::vector<DatasetSpec>& specs, int64_t seq_len, uint64_t seed)
    : seq_len_(seq_len), seed_(seed) {
  ZAYA_CHECK(!specs.empty(), "data loader: expected at least one dataset");
  ZAYA_CHECK(seq_len >= 1, "data loader: sequence length must be at least 1, found ", seq_len);
  double total = 0;
  for (const auto& s : specs) {
    ZAYA_CHECK(std::isfinite(s.weight) && s.weight >= 0, s.prefix,
               ": dataset weight must be non-negative, found ", s.weight);
    total += s.weight;
  }
  ZAYA_CHECK(total > 0, "data loader: at least one dataset weight must be positive");
  for (const auto& s : specs) {
    datasets_.push_back(std::make_unique<IndexedDataset>(s.prefix));
    const int64_t tokens = datasets_.back()->num_tokens();
    ZAYA_CHECK(tokens >= seq_len + 1, s.prefix, ": holds ", tokens, " tokens; one sample of sequence length ",
               seq_len, " needs ", seq_len + 1);
    samples_.push_back((tokens - 1) / seq_len);
    weights_.push_back(s.weight / total);
  }
  offsets_.assign(specs.size(), 0);
  perm_.resize(specs.size());
  perm_epoch_.assign(specs.size(), -1);
  blend_checkpoints_.push_back(std::vector<int64_t>(specs.size(), 0));  // counts before sample 0
}

DataLoader::~DataLoader() = default;

int DataLoader::pick(int64_t i, const std::vector<int64_t>& counts) const {
  // The dataset furthest below its target share w_d·max(i, 1); strict > keeps the lowest d on ties.
  // Weight-0 datasets never compete (their error of 0 would win ties against the others).
  const double at = static_cast<double>(std::max<int64_t>(i, 1));
  int best = -1;
  double best_err = 0;
  for (int d = 0; d < num_datasets(); ++d) {
    if (weights_[d] == 0) continue;
    const double err = weights_[d] * at - static_cast<double>(counts[d]);
    if (best < 0 || err > best_err) best = d, best_err = err;
  }
  return best;
}

void DataLoader::blend_counts_before(int64_t i, std::vector<int64_t>& counts) {
  const int64_t k = i / kBlendStride;
  // Extend the checkpoints to stride k: each is the replay of the previous one.
  while (static_cast<int64_t>(blend_checkpoints_.size()) <= k) {
    std::vector<int64_t> c = blend_checkpoints_.back();
    const int64_t start = (static_cast<int64_t>(blend_checkpoints_.size()) - 1) * kBlendStride;
    for (int64_t j = start; j < start + kBlendStride; ++j) ++c[pick(j, c)];
    blend_checkpoints_.push_back(std::move(c));
  }
  // Sequential access (every rank's usual pattern) continues from the last query instead of the
  // checkpoint: O(D) per sample.
  int64_t from = k * kBlendStride;
  if (last_blend_index_ >= from && last_blend_index_ <= i) {
    from = last_blend_index_;
    counts = last_blend_counts_;
  } else {
    counts = blend_checkpoints_[k];
  }
  for (int64_t j = from; j < i; ++j) ++counts[pick(j, counts)];
  last_blend_index_ = i;
  last_blend_counts_ = counts;
}

SampleLocation DataLoader::locate(int64_t i) {
  ZAYA_CHECK(i >= 0, "data loader: global sample index must be non-negative, found ", i);
  SampleLocation loc;
  if (num_datasets() == 1) {
    loc.count = i;
  } else {
    std::vector<int64_t> counts;
    blend_counts_before(i, counts);
    loc.dataset = pick(i, counts);
    loc.count = counts[loc.dataset];
  }
  loc.count += offsets_[loc.dataset];
  const int64_t n = samples_[loc.dataset];
  loc.epoch = loc.count / n;
  loc.sample = permutation(loc.dataset, loc.epoch)[static_cast<size_t>(loc.count % n)];
  return loc;
}

const std::vector<int64_t>& DataLoader::permutation(int d, int64_t epoch) {
  if (perm_epoch_[d] != epoch) {
    const uint64_t key = mix64(seed_ + static_cast<uint64_t>(epoch)) ^ mix64(static_cast<uint64_t>(d) + 1);
    perm_[d] = shuffled_indices(samples_[d], key);
    perm_epoch_[d] = epoch;
  }
  return perm_[d];
}

void DataLoader::sample(int64_t i, int32_t* out) {
  const SampleLocation loc = locate(i);
  datasets_[loc.dataset]->read_tokens(loc.sample * seq_len_, seq_len_ + 1, out);
}

std::vector<int32_t> DataLoader::sample(int64_t i) {
  std::vector<int32_t> out(static_cast<size_t>(seq_len_ + 1));
  sample(i, out.data());
  return out;
}

void DataLoader::next_batch(int rank, int world, Tensor& out) {
  ZAYA_CHECK(world >= 1 && rank >= 0 && rank < world, "data loader: rank ", rank, " of world size ", world);
  check_dtype("data loader batch", out, DType::i32);
  ZAYA_CHECK(out.ndim() == 2 && out.size(1) == seq_len_ + 1, "data loader batch has shape ",
             out.shape().str(), ", expected [micro_batch, ", seq_len_ + 1, "]");
  const int64_t b = out.size(0);
  int32_t* p = out.data<int32_t>();
  for (int64_t j = 0; j < b; ++j) sample(state_ + rank * b + j, p + j * (seq_len_ + 1));
  state_ += world * b;
}

void DataLoader::set_dataset_offsets(const std::vector<int64_t>& offsets) {
  ZAYA_CHECK(offsets.size() == datasets_.size(), "data loader: expected ", datasets_.size(),
             " dataset offsets, found ", offsets.size());
  for (int64_t o : offsets)
    ZAYA_CHECK(o >= 0, "data loader: dataset offsets must be non-negative, found ", o);
  offsets_ = offsets;
}

std::vector<int64_t> DataLoader::dataset_counts(int64_t i) {
  ZAYA_CHECK(i >= 0, "data loader: global sample index must be non-negative, found ", i);
  std::vector<int64_t> counts;
  if (num_datasets() == 1) {
    counts = {i};
  } else {
    blend_counts_before(i, counts);
  }
  for (size_t d = 0; d < counts.size(); ++d) counts[d] += offsets_[d];
  return counts;
}

void DataLoader::set_state(int64_t next_global_index) {
  ZAYA_CHECK(next_global_index >= 0, "data loader state must be non-negative, found ", next_global_index);
  state_ = next_global_index;
}

}  // namespace zaya::data
