#include "zaya/train/train_step.h"

#include <algorithm>
#include <chrono>

#include "zaya/ops/optim_ops.h"
#include "zaya/train/batch.h"

namespace zaya::train {
namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

TrainStep::TrainStep(model::ZayaModel& model, optim::Optimizer& optimizer, dist::Communicator& comm)
    : model_(model), optimizer_(optimizer), comm_(comm) {
  // Until data parallelism lands, the step has no gradient reduction: refuse a larger world
  // rather than let each rank train alone (the trainer says so at start with a clearer message).
  ZAYA_CHECK(comm_.size() == 1, "TrainStep: a world of ", comm_.size(),
             " ranks needs data-parallel gradient reduction, which is not built yet");
  shape_batch();
}

void TrainStep::shape_batch() {
  const int64_t B = model_.batch(), T = model_.seq_len();
  rows_ = Tensor::empty({B, T + 1}, DType::i32);
  ids_ = Tensor::empty({B, T}, DType::i32);
  targets_ = Tensor::empty({B, T}, DType::i32);
}

StepResult TrainStep::run(data::DataLoader& data, int64_t micro_batches, double lr,
                          const std::function<double()>& fence) {
  ZAYA_CHECK(micro_batches > 0, "TrainStep::run: micro_batches must be positive, found ", micro_batches);
  if (rows_.size(1) != model_.seq_len() + 1 || rows_.size(0) != model_.batch()) shape_batch();
  const int64_t L = model_.config().num_hidden_layers;
  StepResult r;
  r.skipped.assign(static_cast<size_t>(L), 0);
  const auto start = Clock::now();
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const auto t0 = Clock::now();
    data.next_batch(comm_.rank(), comm_.size(), rows_);
    split_rows(rows_, ids_, targets_);
    const auto t1 = Clock::now();
    r.loss += model_.forward(ids_, targets_) / static_cast<double>(micro_batches);
    const auto t2 = Clock::now();
    model_.backward();
    const auto t3 = Clock::now();
    model_.add_expert_counts(r.expert_counts);
    const std::vector<model::RouterStats> stats = model_.router_stats();
    for (int64_t l = 0; l < L; ++l) r.skipped[static_cast<size_t>(l)] += stats[static_cast<size_t>(l)].skipped;
    r.time.data += seconds(t0, t1);
    r.time.forward += seconds(t1, t2);
    r.time.backward += seconds(t2, t3);
  }
  // The gradient-sync point. Gradients were summed over micro-batches of equal token counts:
  // average them. (Data parallelism reduces them across ranks here.)
  if (micro_batches > 1) ops::scale_inplace(model_.grads_flat(), 1.0f / static_cast<float>(micro_batches));
  r.sequences = micro_batches * model_.batch() * comm_.size();
  r.tokens = r.sequences * model_.seq_len();

  r.time.checkpoint_fence = fence ? fence() : 0.0;
  const auto t_opt = Clock::now();
  r.update = optimizer_.step(lr);
  optimizer_.balance_step(r.expert_counts, lr);
  const auto end = Clock::now();
  r.time.optimizer = seconds(t_opt, end);
  r.time.step = seconds(start, end);
  return r;
}

}  // namespace zaya::train
