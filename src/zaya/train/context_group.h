// The model's context-parallel exchanges (model/context_parallel.h) over a communicator: the cp
// axis of the process mesh. Counts the bytes each rank sends, for the benchmarks and the summary.
#pragma once

#include <cstdint>

#include "zaya/dist/communicator.h"
#include "zaya/model/context_parallel.h"

namespace zaya::train {

class CommContextGroup final : public model::ContextGroup {
 public:
  explicit CommContextGroup(dist::Communicator& cp) : comm_(cp) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_gather(const Tensor& recv, const Tensor& send) override;
  void reduce_scatter(const Tensor& recv, const Tensor& send) override;
  // Bytes this rank put on the wire since construction (or reset): (size − 1)/size of each
  // gathered or reduced buffer, what a ring algorithm sends per rank.
  double bytes_sent() const { return bytes_; }
  int64_t calls() const { return calls_; }
  void reset_counters() { bytes_ = 0, calls_ = 0; }

 private:
  dist::Communicator& comm_;
  double bytes_ = 0;
  int64_t calls_ = 0;
};

}  // namespace zaya::train
