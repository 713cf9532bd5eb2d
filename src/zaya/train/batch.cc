#include "zaya/train/batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace zaya::train {

void split_rows(const Tensor& rows, const Tensor& ids, const Tensor& targets) {
  const int64_t b = rows.size(0), t1 = rows.size(1), T = t1 - 1;
  check_shape("ids", ids, {b, T});
  check_shape("targets", targets, {b, T});
  const int32_t* r = rows.data<int32_t>();
  int32_t* x = ids.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    std::memcpy(x + i * T, r + i * t1, static_cast<size_t>(T) * sizeof(int32_t));
    std::memcpy(y + i * T, r + i * t1 + 1, static_cast<size_t>(T) * sizeof(int32_t));
  }
}

BatchBuffers::BatchBuffers(int64_t batch, int64_t seq_len, Device device) {
  rows = Tensor::empty({batch, seq_len + 1}, DType::i32);
  host_ids = Tensor::empty({batch, seq_len}, DType::i32);
  host_targets = Tensor::empty({batch, seq_len}, DType::i32);
  const bool host = device == Device::cpu;
  dev_ids_ = host ? host_ids : Tensor::empty({batch, seq_len}, DType::i32, device);
  dev_targets_ = host ? host_targets : Tensor::empty({batch, seq_len}, DType::i32, device);
}

void BatchBuffers::split() {
  split_rows(rows, host_ids, host_targets);
  if (dev_ids_.shares_storage_with(host_ids)) return;
  dev_ids_.copy_from(host_ids);
  dev_targets_.copy_from(host_targets);
}

void BatchBuffers::upload_targets() {
  if (!dev_targets_.shares_storage_with(host_targets)) dev_targets_.copy_from(host_targets);
}

EvalResult evaluate(model::ZayaModel& model, data::DataLoader& loader, int64_t samples, dist::Communicator* comm,
                    const std::function<void(int64_t, int64_t)>& on_batch) {
  const int64_t B = model.batch(), T = model.seq_len();
  ZAYA_CHECK(loader.seq_len() == T, "evaluation data has sequence length ", loader.seq_len(), ", the model expects ", T);
  ZAYA_CHECK(samples > 0, "evaluate: samples must be positive, found ", samples);
  const int64_t rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  // Whole model batches, but never past one epoch of a single dataset: a second epoch would count
  // its sequences twice. The last batch is then partial; its missing rows have ignored targets.
  int64_t n = (samples + B - 1) / B * B;
  if (loader.num_datasets() == 1) n = std::min(n, loader.samples_per_epoch(0));
  BatchBuffers batch(B, T, model.device());
  int32_t* rows = batch.rows.data<int32_t>();
  const int64_t full = n / B, last = n % B;
  double sums[2] = {0, 0};  // of the full batches' mean losses; the partial batch's mean loss
  // This rank's batches: k = rank, rank + world, ... of the full + (last != 0) batches.
  const int64_t batches = full + (last != 0 ? 1 : 0);
  const int64_t mine = batches > rank ? (batches - rank + world - 1) / world : 0;
  int64_t done = 0;
  for (int64_t k = rank; k < full; k += world) {
    for (int64_t i = 0; i < B; ++i) loader.sample(k * B + i, rows + i * (T + 1));
    batch.split();
    sums[0] += model.forward(batch.ids(), batch.targets(), /*for_backward=*/false);  // every batch has B*T targets
    if (on_batch) on_batch(++done, mine);
  }
  if (last != 0 && full % world == rank) {
    for (int64_t i = 0; i < B; ++i) loader.sample(full * B + std::min(i, last - 1), rows + i * (T + 1));
    batch.split();
    int32_t* targets = batch.host_targets.data<int32_t>();
    std::fill(targets + last * T, targets + B * T, -100);  // ignored rows
    batch.upload_targets();
    sums[1] = model.forward(batch.ids(), batch.targets(), /*for_backward=*/false);  // mean over last*T targets
    if (on_batch) on_batch(++done, mine);
  }
  if (world > 1) {
    double total[2];
    comm->all_reduce(sums, total, 2, DType::f64);
    sums[0] = total[0], sums[1] = total[1];
  }
  EvalResult r;
  if (last == 0)
    r.loss = sums[0] / static_cast<double>(full);
  else
    r.loss = (sums[0] * static_cast<double>(B) + sums[1] * static_cast<double>(last)) / static_cast<double>(n);
  r.perplexity = std::exp(r.loss);
  r.tokens = n * T;
  return r;
}

}  // namespace zaya::train
