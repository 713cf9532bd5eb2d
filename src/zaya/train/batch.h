// Turning loader rows into model inputs, and evaluating a model on a dataset.
#pragma once

#include <cstdint>
#include <functional>

#include "zaya/core/tensor.h"
#include "zaya/data/loader.h"
#include "zaya/dist/communicator.h"
#include "zaya/model/zaya_model.h"

namespace zaya::train {

// rows [b, T+1] i32 (packed samples) -> ids [b, T] = rows[:, :T], targets [b, T] = rows[:, 1:].
void split_rows(const Tensor& rows, const Tensor& ids, const Tensor& targets);

// The input buffers of a model's [B, T] batches on any device. The loader fills `rows` on the host
// and split() makes the ids and targets there; for a model on a GPU they then go over in one copy
// each (2·B·T·4 bytes: microseconds, next to a step of milliseconds), so `ids()` and `targets()`
// are always on the model's device.
class BatchBuffers {
 public:
  BatchBuffers() = default;
  BatchBuffers(int64_t batch, int64_t seq_len, Device device);
  int64_t batch() const { return rows.size(0); }
  int64_t seq_len() const { return rows.size(1) - 1; }
  // rows → host ids and targets → the device's.
  void split();
  // After editing host_targets (ignored rows), sends them again.
  void upload_targets();
  const Tensor& ids() const { return dev_ids_; }
  const Tensor& targets() const { return dev_targets_; }

  Tensor rows;                       // [B, T+1] i32, host
  Tensor host_ids, host_targets;     // [B, T] i32, host

 private:
  Tensor dev_ids_, dev_targets_;     // [B, T] i32 on the device (the host ones on the CPU)
};

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
// `on_batch(done, total)`, if given, is called after each of this rank's batches (for progress).
EvalResult evaluate(model::ZayaModel& model, data::DataLoader& loader, int64_t samples,
                    dist::Communicator* comm = nullptr,
                    const std::function<void(int64_t done, int64_t total)>& on_batch = {});

}  // namespace zaya::train
