// Turning loader rows into model inputs, and evaluating a model on a dataset.
#pragma once

#include <cstdint>

#include "zaya/core/tensor.h"
#include "zaya/data/loader.h"
#include "zaya/dist/communicator.h"
#include "zaya/model/zaya_model.h"

namespace zaya::train {

// rows [b, T+1] i32 (packed samples) -> ids [b, T] = rows[:, :T], targets [b, T] = rows[:, 1:].
void split_rows(const Tensor& rows, const Tensor& ids, const Tensor& targets);

struct EvalResult {
  double loss = 0;        // mean cross-entropy, nats per token
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;
};

// Mean loss over global samples [0, samples) of `loader` (rounded up to whole model batches, but
// for a one-dataset loader never past its first epoch, so no sample counts twice), in order:
// deterministic, and the same samples every evaluation. Leaves no gradients behind.
// With `comm` (data parallelism), rank r evaluates the batches k ≡ r (mod world) and the sums are
// combined, so every rank returns the same result as one rank would (to summation order).
// With `cp` (context parallelism, the model's group) the ranks of cp evaluate the same batches,
// each its zigzag part, and their losses are averaged (the parts hold equal token counts).
EvalResult evaluate(model::ZayaModel& model, data::DataLoader& loader, int64_t samples,
                    dist::Communicator* comm = nullptr, dist::Communicator* cp = nullptr);

}  // namespace zaya::train
