#include "zaya/train/batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "zaya/model/context_parallel.h"

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

BatchBuffers::BatchBuffers(int64_t batch, int64_t seq_len, Device device, int64_t cp_rank, int64_t cp)
    : cp_rank_(cp_rank), cp_(cp) {
  rows = Tensor::empty({batch, seq_len + 1}, DType::i32);
  host_ids = Tensor::empty({batch, seq_len}, DType::i32);
  host_targets = Tensor::empty({batch, seq_len}, DType::i32);
  part_ids_ = cp == 1 ? host_ids : Tensor::empty({batch, seq_len / cp}, DType::i32);
  part_targets_ = cp == 1 ? host_targets : Tensor::empty({batch, seq_len / cp}, DType::i32);
  const bool host = device == Device::cpu;
  dev_ids_ = host ? part_ids_ : Tensor::empty({batch, seq_len / cp}, DType::i32, device);
  dev_targets_ = host ? part_targets_ : Tensor::empty({batch, seq_len / cp}, DType::i32, device);
}

void BatchBuffers::split() {
  split_rows(rows, host_ids, host_targets);
  upload();
}

void BatchBuffers::upload() {
  if (cp_ > 1) {
    model::zigzag_select(part_ids_, host_ids, cp_rank_, cp_);
    model::zigzag_select(part_targets_, host_targets, cp_rank_, cp_);
  }
  if (dev_ids_.shares_storage_with(part_ids_)) return;
  dev_ids_.copy_from(part_ids_);
  dev_targets_.copy_from(part_targets_);
}

EvalResult evaluate(model::ZayaModel& model, data::DataLoader& loader, int64_t samples, dist::Communicator* comm,
                    dist::Communicator* cp, const std::function<void(int64_t, int64_t)>& on_batch) {
  const int64_t B = model.batch(), T = model.seq_len();
  ZAYA_CHECK(loader.seq_len() == T, "evaluation data has sequence length ", loader.seq_len(), ", the model expects ", T);
  ZAYA_CHECK(samples > 0, "evaluate: samples must be positive, found ", samples);
  const int64_t rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  // Whole model batches, but never past one epoch of a single dataset: a second epoch would count
  // its sequences twice. The last batch is then partial; its missing rows have ignored targets.
  int64_t n = (samples + B - 1) / B * B;
  if (loader.num_datasets() == 1) n = std::min(n, loader.samples_per_epoch(0));
  const int64_t ncp = cp ? cp->size() : 1;
  ZAYA_CHECK(model.cp_size() == ncp, "evaluate: the model is context parallel over ", model.cp_size(),
             " ranks, the evaluation's cp group has ", ncp);
  BatchBuffers batch(B, T, model.device(), cp ? cp->rank() : 0, ncp);
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
    split_rows(batch.rows, batch.host_ids, batch.host_targets);
    int32_t* targets = batch.host_targets.data<int32_t>();
    std::fill(targets + last * T, targets + B * T, -100);  // ignored rows
    batch.upload();
    // Mean over last*T targets (last*T/cp on each cp rank).
    sums[1] = model.forward(batch.ids(), batch.targets(), /*for_backward=*/false);
    if (on_batch) on_batch(++done, mine);
  }
  if (world > 1) {
    double total[2];
    comm->all_reduce(sums, total, 2, DType::f64);
    sums[0] = total[0], sums[1] = total[1];
  }
  if (ncp > 1) {  // the mean of the cp parts' means
    double total[2];
    cp->all_reduce(sums, total, 2, DType::f64);
    sums[0] = total[0] / static_cast<double>(ncp), sums[1] = total[1] / static_cast<double>(ncp);
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
