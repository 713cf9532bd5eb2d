#include "zaya/train/batch.h"

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

EvalResult evaluate(model::ZayaModel& model, data::DataLoader& loader, int64_t samples) {
  const int64_t B = model.batch(), T = model.seq_len();
  ZAYA_CHECK(loader.seq_len() == T, "evaluation data has sequence length ", loader.seq_len(), ", the model expects ", T);
  Tensor rows = Tensor::empty({B, T + 1}, DType::i32);
  Tensor ids = Tensor::empty({B, T}, DType::i32), targets = Tensor::empty({B, T}, DType::i32);
  const int64_t batches = (samples + B - 1) / B;
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) {
    for (int64_t i = 0; i < B; ++i) loader.sample(k * B + i, rows.data<int32_t>() + i * (T + 1));
    split_rows(rows, ids, targets);
    sum += model.forward(ids, targets, /*for_backward=*/false);  // every batch has B*T targets
  }
  EvalResult r;
  r.loss = sum / static_cast<double>(batches);
  r.perplexity = std::exp(r.loss);
  r.tokens = batches * B * T;
  return r;
}

}  // namespace zaya::train
