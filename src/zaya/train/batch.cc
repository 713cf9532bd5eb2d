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
                    dist::Communicator* cp) {
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
  const int64_t ncp = cp ? cp->size() : 1;
  ZAYA_CHECK(model.cp_size() == ncp, "evaluate: the model is context parallel over ", model.cp_size(),
             " ranks, the evaluation's cp group has ", ncp);
  Tensor local_ids = Tensor::empty({B, T / ncp}, DType::i32), local_targets = Tensor::empty({B, T / ncp}, DType::i32);
  // The forward on this rank's part of the batch (all of it without context parallelism).
  const auto loss_of = [&] {
    if (ncp == 1) return model.forward(ids, targets, /*for_backward=*/false);
    model::zigzag_select(local_ids, ids, cp->rank(), ncp);
    model::zigzag_select(local_targets, targets, cp->rank(), ncp);
    return model.forward(local_ids, local_targets, /*for_backward=*/false);
  };
  const int64_t full = n / B, last = n % B;
  double sums[2] = {0, 0};  // of the full batches' mean losses; the partial batch's mean loss
  for (int64_t k = rank; k < full; k += world) {
    for (int64_t i = 0; i < B; ++i) loader.sample(k * B + i, rows.data<int32_t>() + i * (T + 1));
    split_rows(rows, ids, targets);
    sums[0] += loss_of();  // every batch has B*T targets
  }
  if (last != 0 && full % world == rank) {
    for (int64_t i = 0; i < B; ++i) loader.sample(full * B + std::min(i, last - 1), rows.data<int32_t>() + i * (T + 1));
    split_rows(rows, ids, targets);
    std::fill(targets.data<int32_t>() + last * T, targets.data<int32_t>() + B * T, -100);  // ignored rows
    sums[1] = loss_of();  // mean over last*T targets (last*T/cp on each cp rank)
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
