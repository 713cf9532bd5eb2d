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

// The input buffers of a model's [B, S] batches on any device, with context parallelism or
// without. The loader fills `rows` on the host; split() makes the ids and targets there, keeps this
// cp rank's zigzag part of each sequence (cp > 1), and for a model on a GPU sends that part over in
// one copy each (2·B·S/cp·4 bytes: microseconds, next to a step of milliseconds), so `ids()` and
// `targets()` are always what the model's forward takes, on its device.
class BatchBuffers {
 public:
  BatchBuffers() = default;
  BatchBuffers(int64_t batch, int64_t seq_len, Device device, int64_t cp_rank = 0, int64_t cp = 1);
  int64_t batch() const { return rows.size(0); }
  int64_t seq_len() const { return rows.size(1) - 1; }  // the whole sequence's
  // rows → host ids and targets → this rank's part → the device.
  void split();
  // After editing host_targets (ignored rows), this rank's part of them again.
  void upload();
  const Tensor& ids() const { return dev_ids_; }
  const Tensor& targets() const { return dev_targets_; }

  Tensor rows;                    // [B, S+1] i32, host
  Tensor host_ids, host_targets;  // [B, S] i32, host

 private:
  int64_t cp_rank_ = 0, cp_ = 1;
  Tensor part_ids_, part_targets_;  // [B, S/cp] i32, host: this cp rank's zigzag part (host_* when cp = 1)
  Tensor dev_ids_, dev_targets_;    // [B, S/cp] i32 on the device (part_* on the CPU)
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
// With `cp` (context parallelism, the model's group) the ranks of cp evaluate the same batches,
// each its zigzag part, and their losses are averaged (the parts hold equal token counts).
EvalResult evaluate(model::ZayaModel& model, data::DataLoader& loader, int64_t samples,
                    dist::Communicator* comm = nullptr, dist::Communicator* cp = nullptr,
                    const std::function<void(int64_t done, int64_t total)>& on_batch = {});

}  // namespace zaya::train
