#include "zaya/train/train_step.h"

#include <algorithm>
#include <chrono>

#include "zaya/ops/optim_ops.h"

namespace zaya::train {
namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

TrainStep::TrainStep(model::ZayaModel& model, optim::Optimizer& optimizer, dist::Communicator& comm,
                     GradientSync* sync, int cp, MasterWeights* master, bool prefetch_gather)
    : model_(model), optimizer_(optimizer), comm_(comm), sync_(sync), cp_(cp), master_(master),
      prefetch_gather_(prefetch_gather) {
  ZAYA_CHECK(comm_.size() == 1 || sync_, "TrainStep: a world of ", comm_.size(),
             " ranks needs a GradientSync to reduce the gradients");
  ZAYA_CHECK(cp_ >= 1 && comm_.size() % cp_ == 0 && model_.cp_size() == cp_, "TrainStep: parallel.cp = ", cp_,
             " must divide the world of ", comm_.size(), " ranks and equal the model's context-parallel group (",
             model_.cp_size(), ")");
  shape_batch();
}

void TrainStep::shape_batch() {
  batch_ = BatchBuffers(model_.batch(), model_.seq_len(), model_.device(), comm_.rank() % cp_, cp_);
}

StepResult TrainStep::run(data::DataLoader& data, int64_t micro_batches, double lr,
                          const std::function<double()>& fence) {
  ZAYA_CHECK(micro_batches > 0, "TrainStep::run: micro_batches must be positive, found ", micro_batches);
  if (batch_.seq_len() != model_.seq_len() || batch_.batch() != model_.batch()) shape_batch();
  const int64_t L = model_.config().num_hidden_layers;
  const int world = comm_.size(), dp = world / cp_, dp_rank = comm_.rank() / cp_;
  StepResult r;
  r.skipped.assign(static_cast<size_t>(L), 0);
  std::vector<double> losses;  // this rank's micro-batch losses, in order
  const auto start = Clock::now();
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const bool last = micro + 1 == micro_batches;
    const auto t0 = Clock::now();
    // Micro-batch `micro` of dp rank r is global micro-batch micro·dp + r: the step's samples do
    // not depend on the world size. The cp ranks of a dp group read the same rows and keep their
    // zigzag parts.
    data.next_batch(dp_rank, dp, batch_.rows);
    batch_.split();
    const auto t1 = Clock::now();
    losses.push_back(model_.forward(batch_.ids(), batch_.targets()));
    const auto t2 = Clock::now();
    if (sync_) {
      model_.backward(sync_->ready_fn(last));
      sync_->end_backward(last);
    } else {
      model_.backward();
    }
    const auto t3 = Clock::now();
    model_.add_expert_counts(r.expert_counts);
    const std::vector<model::RouterStats> stats = model_.router_stats();
    for (int64_t l = 0; l < L; ++l) r.skipped[static_cast<size_t>(l)] += stats[static_cast<size_t>(l)].skipped;
    r.time.data += seconds(t0, t1);
    r.time.forward += seconds(t1, t2);
    r.time.backward += seconds(t2, t3);
  }
  // The gradient-sync point: the mean gradient over every rank's micro-batches of equal token
  // counts (in the owned range, with data parallelism). A cp rank's loss is the mean over its part
  // of the micro-batch, every part has the same number of tokens (the loader's targets are never
  // ignored), so the mean over the world's parts is the mean over the global batch's tokens.
  const int64_t total = micro_batches * world;
  if (sync_) {
    sync_->finish(total);
  } else if (micro_batches > 1) {
    ops::scale_inplace(model_.grads_flat(), 1.0f / static_cast<float>(micro_batches));
  }
  if (world > 1) {
    // The step's loss summed in global micro-batch order (as one rank sums it), and the global
    // expert loads for the metrics and the balancer.
    std::vector<double> all(static_cast<size_t>(total));
    comm_.host_all_gather(losses.data(), all.data(), losses.size() * sizeof(double));
    losses.assign(static_cast<size_t>(total), 0.0);
    for (int rank = 0; rank < world; ++rank)
      for (int64_t m = 0; m < micro_batches; ++m)
        losses[static_cast<size_t>(m * world + rank)] = all[static_cast<size_t>(rank * micro_batches + m)];
    std::vector<int64_t> counts(r.expert_counts.size() + r.skipped.size());
    std::copy(r.expert_counts.begin(), r.expert_counts.end(), counts.begin());
    std::copy(r.skipped.begin(), r.skipped.end(), counts.begin() + static_cast<std::ptrdiff_t>(r.expert_counts.size()));
    std::vector<int64_t> summed(counts.size());
    comm_.all_reduce(counts.data(), summed.data(), counts.size(), DType::i64);
    std::copy(summed.begin(), summed.begin() + static_cast<std::ptrdiff_t>(r.expert_counts.size()), r.expert_counts.begin());
    std::copy(summed.begin() + static_cast<std::ptrdiff_t>(r.expert_counts.size()), summed.end(), r.skipped.begin());
  }
  for (double l : losses) r.loss += l / static_cast<double>(total);
  r.sequences = micro_batches * dp * model_.batch();
  r.tokens = r.sequences * model_.seq_len();

  r.time.checkpoint_fence = fence ? fence() : 0.0;
  const auto t_opt = Clock::now();
  r.update = optimizer_.step(lr);
  if (master_) master_->after_update();
  if (sync_) {
    sync_->start_param_gather();
    if (!prefetch_gather_) sync_->settle_params();
  }
  optimizer_.balance_step(r.expert_counts, lr);
  const auto end = Clock::now();
  r.time.optimizer = seconds(t_opt, end);
  r.time.step = seconds(start, end);
  if (sync_) r.time.sync = sync_->times();
  return r;
}

}  // namespace zaya::train
