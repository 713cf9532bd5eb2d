// The model's context-parallel exchanges (model/context_parallel.h) over a communicator: the cp
// axis of the process mesh. Counts the bytes each rank sends, for the benchmarks and the summary.
#pragma once

#include <cstdint>
#include <memory>

#include "zaya/dist/communicator.h"
#include "zaya/dist/mesh.h"
#include "zaya/model/context_parallel.h"

namespace zaya::train {

class CommContextGroup final : public model::ContextGroup {
 public:
  explicit CommContextGroup(dist::Communicator& cp) : comm_(cp) {}
  // Over a communicator of its own (a device world's cp split).
  explicit CommContextGroup(std::unique_ptr<dist::Communicator> cp) : owned_(std::move(cp)), comm_(*owned_) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  // The communicator's start_all_gather / start_reduce_scatter; the Exchange holds its Work.
  model::Exchange start_all_gather(const Tensor& recv, const Tensor& send) override;
  model::Exchange start_reduce_scatter(const Tensor& recv, const Tensor& send) override;
  dist::Backend backend() const { return comm_.backend(); }
  // Bytes this rank put on the wire since construction (or reset): (size − 1)/size of each
  // gathered or reduced buffer, what a ring algorithm sends per rank.
  double bytes_sent() const { return bytes_; }
  int64_t calls() const { return calls_; }
  // Seconds this rank spent blocked on the exchanges since construction (or reset): inside their
  // start and wait calls, the exchange time compute did not hide (a blocking exchange's whole
  // time, waiting for the slowest rank included). test() polls are not counted.
  double blocked_seconds() const { return blocked_s_; }
  void reset_counters() { bytes_ = 0, calls_ = 0, blocked_s_ = 0; }

 private:
  class Pending;
  std::unique_ptr<dist::Communicator> owned_;
  dist::Communicator& comm_;
  double bytes_ = 0;
  int64_t calls_ = 0;
  double blocked_s_ = 0;
};

// The group the model exchanges over, for this rank of `mesh`. With a device world (NCCL over the
// same ranks as the mesh's world: a GPU run of several ranks), that world split into the mesh's cp
// groups, so the halos and K/V move between device buffers with no host copies; otherwise the
// mesh's cp axis (MPI: host buffers, and the emulated device's, which are host memory).
// Collective over the device world when there is one: every rank calls it.
std::unique_ptr<CommContextGroup> make_context_group(dist::Mesh& mesh, dist::Communicator* device_world);

}  // namespace zaya::train
