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
  Tensor rows = Tensor::empty({B, T + 1}, DType::i32);
  Tensor ids = Tensor::empty({B, T}, DType::i32), targets = Tensor::empty({B, T}, DType::i32);
  const int64_t full = n / B, last = n % B;
  double sums[2] = {0, 0};  // of the full batches' mean losses; the partial batch's mean loss
  // This rank's batches: k = rank, rank + world, ... of the full + (last != 0) batches.
  const int64_t batches = full + (last != 0 ? 1 : 0);
  const int64_t mine = batches > rank ? (batches - rank + world - 1) / world : 0;
  int64_t done = 0;
  for (int64_t k = rank; k < full; k += world) {
    for (int64_t i = 0; i < B; ++i) loader.sample(k * B + i, rows.data<int32_t>() + i * (T + 1));
    split_rows(rows, ids, targets);
    sums[0] += model.forward(ids, targets, /*for_backward=*/false);  // every batch has B*T targets
    if (on_batch) on_batch(++done, mine);
  }
  if (last != 0 && full % world == rank) {
    for (int64_t i = 0; i < B; ++i) loader.sample(full * B + std::min(i, last - 1), rows.data<int32_t>() + i * (T + 1));
    split_rows(rows, ids, targets);
    std::fill(targets.data<int32_t>() + last * T, targets.data<int32_t>() + B * T, -100);  // ignored rows
    sums[1] = model.forward(ids, targets, /*for_backward=*/false);  // mean over last*T targets
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
