// Data-parallel gradient synchronization for ZeRO-1 (docs/data-parallel.md): the gradient buckets
// reduced while backward goes on, and the parameter all-gather after the update.
//
// Every rank holds the whole parameter and gradient buffers; the shard plan gives each rank one
// contiguous range whose optimizer state it owns. During the step's last micro-batch, backward
// reports flat gradient ranges as they become final (ZayaModel::ready_order: the final norm, the
// layers last to first, the embedding). Consecutive reports are grouped into buckets of about
// `bucket_elements`; when a bucket's last range is reported, the bucket is reduce-scattered in
// place — each rank receives the sum over ranks of the bucket's intersection with its range — and
// backward continues. After backward, finish() waits for the buckets and leaves in the owned range
// the mean gradient over every rank's micro-batches. The optimizer updates the owned range, and
// the parameter all-gather sends every rank's updated range to every rank, over the same buckets in
// forward order: start_param_gather() issues them all, and with prefetching
// (parallel.overlap_param_gather) the next forward waits for each bucket only when it first reads
// it (need_params, the model's ParamNeedFn), so the gather runs under the forward. Without
// prefetching settle_params() waits for every bucket right away. Either way the values are the
// same: prefetching moves only when the step waits.
//
// Who waits: on a device communicator (nccl) need_params makes the compute stream wait for the
// buckets on the GPU (dist::Work::wait_on_compute_stream) and returns at once, so the host goes on
// queueing the forward's kernels while the gather is in flight; the host completes those gathers
// later, through the communicator's timeout: in finish(), in settle_params(), or at the next host
// wait on the device (a copy to the host). On host communicators (mpi, local) the host waits
// in need_params, as the forward's reads are the host's.
//
// The parameters travel as the model stores them, in place: f32, or bf16 (train.param_dtype =
// "bf16", train/master_weights.h: half the bytes).
//
// What travels (GradReduce):
//   f32  the model's f32 gradient buffer, summed over micro-batches in f32, reduced in f32.
//   bf16 the same, converted to bf16 per bucket and reduced in bf16 (half the bytes; each
//        pairwise sum rounds to bf16).
//   f64  the order-independent mode: every micro-batch's gradient is added to an fp64 buffer as
//        backward reports it, the buckets are reduced in fp64, and the owned range is rounded to
//        f32 once. The sum of a step's few f32 terms is then exact in fp64 (unless they differ in
//        magnitude by more than 2^29), so it does not depend on how the micro-batches are spread
//        over the ranks: N ranks train bitwise like one (given the same threads per rank).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"
#include "zaya/dist/bucket_plan.h"
#include "zaya/dist/communicator.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/shard_plan.h"

namespace zaya::train {

enum class GradReduce { f32, bf16, f64 };
GradReduce parse_grad_reduce(const std::string& name, const std::string& field);  // "f32" | "bf16" | "f64"
const char* grad_reduce_name(GradReduce r);

struct SyncTimes {
  double comm_s = 0;     // time some bucket reduction was in flight (the union of their spans)
  double exposed_s = 0;  // ... of which the step waited: after backward, and inside the
                         // communicator's calls during backward
  double hidden_s = 0;   // the rest: communication that ran while backward computed
  int buckets = 0;
  // The parameter all-gather this step's forward used (the previous update's): the time it was in
  // flight, and of that the time the step waited for it (inside the forward, or all of it without
  // prefetching). On a device communicator the forward's kernels wait on the GPU, not the host:
  // gather_exposed_s then adds to the host's waits the time the compute stream stood at those
  // waits (CUDA events around each), and gather_s ends when the host saw the last bucket land
  // (it polls at each need_params and gradient report), which can be later than it landed.
  double gather_s = 0;
  double gather_exposed_s = 0;
  double hidden_fraction() const { return comm_s > 0 ? hidden_s / comm_s : 0.0; }
};

class GradientSync {
 public:
  // `dp` is the data-parallel communicator (its size is the plan's rank count); params (f32 or
  // bf16) and grads (f32) the model's flat buffers; `ready_order` the model's report order, which
  // must tile the buffers exactly.
  GradientSync(dist::Communicator& dp, const optim::ShardPlan& plan, const Tensor& params, const Tensor& grads,
               std::vector<std::pair<int64_t, int64_t>> ready_order, GradReduce mode, int64_t bucket_elements);

  // The callback for the backward of one micro-batch (`last`: the step's last one). Bucket
  // reductions start from inside it.
  model::ZayaModel::GradReadyFn ready_fn(bool last);
  // After each micro-batch's backward: checks every range was reported; marks backward's end.
  void end_backward(bool last);
  // Waits for every bucket; the owned range of grads becomes the mean over `micro_batches_total`
  // micro-batches (every rank's). The rest of grads is left unspecified (the optimizer zeroes it).
  void finish(int64_t micro_batches_total);
  // Every rank's updated range to every rank (after the optimizer step): issues the gather of every
  // bucket. need_params(begin, end) waits for the buckets that hold any of [begin, end) (the model
  // calls it before it reads a range): for the compute stream's kernels, on the device where the
  // communicator's operations allow it, else on the host. settle_params() completes all of them on
  // the host. Until a bucket was waited for, its parameters outside the owned range must not be
  // read; after need_params alone, only by kernels on the calling thread's compute stream (or by
  // host copies from the device, which wait for that stream).
  void start_param_gather();
  void need_params(int64_t begin, int64_t end);
  void settle_params();
  bool params_pending() const { return next_gather_wait_ < gathers_.size(); }

  const SyncTimes& times() const { return times_; }
  GradReduce mode() const { return mode_; }
  // The bucket plan for the start-up summary: count, sizes, wire dtype, bytes per step.
  std::string plan_str() const;
  // Extra memory this sync holds (the fp64 accumulator or the bf16 gradient wire), bytes.
  int64_t buffer_bytes() const;
  // Bytes one rank sends per step in theory: reduce-scatter and all-gather each move (N−1)/N of
  // the buffer in their wires' element sizes.
  double bytes_per_step() const;

 private:
  void on_ready(int64_t begin, int64_t end, bool last);
  void start_bucket(const dist::Bucket& b);
  void poll();
  // The parameter gathers: order_gather(g) makes the forward's reads of bucket g wait for it (the
  // compute stream on a device, else the host); gather_done(g) records its completion on the host;
  // poll_gathers() tests the incomplete ones; complete_gathers() waits on the host for those left
  // to the device; read_stalls() adds the compute stream's waits for them to gather_stalled_s_.
  void order_gather(size_t g);
  void gather_done(size_t g);
  void poll_gathers();
  void complete_gathers();
  void read_stalls();
  std::vector<size_t> counts_of(int64_t begin, int64_t end) const;

  dist::Communicator& dp_;
  optim::ShardPlan plan_;
  Tensor params_, grads_;
  GradReduce mode_;
  std::vector<std::pair<int64_t, int64_t>> order_;
  std::vector<dist::Bucket> buckets_;
  Tensor wide_;  // f64 [P] (f64 mode)
  Tensor wire_;  // bf16 [P]: the bf16 gradient wire
  size_t next_report_ = 0;
  size_t next_bucket_ = 0;
  struct InFlight {
    dist::Work work;
    std::chrono::steady_clock::time_point issued, done;
    bool complete = false;     // on the host
    bool on_device = false;    // a gather the compute stream waits for, not yet complete on the host
    bool stall_timed = false;  // its stall events were recorded and not yet read
  };
  std::vector<InFlight> flights_;
  // The parameter gather: one per bucket, in forward order (buckets_ reversed); the first
  // next_gather_wait_ were waited for (on the host, or left to the device).
  std::vector<InFlight> gathers_;
  size_t next_gather_wait_ = 0;
  size_t gathers_done_ = 0;       // complete on the host
  size_t gathers_on_device_ = 0;  // left to the device and not yet complete on the host
  size_t stalls_unread_ = 0;      // gathers whose stall events were recorded and not yet read
  std::chrono::steady_clock::time_point gather_issued_;
  double gather_waited_s_ = 0;   // the host's waits for this gather
  double gather_stalled_s_ = 0;  // the compute stream's (device communicators)
  // Two timing events per gather (before and after the compute stream's wait), on a device
  // communicator only.
  std::vector<std::unique_ptr<cuda::Event>> stall_events_;
  std::chrono::steady_clock::time_point backward_end_;
  double blocked_s_ = 0;  // spent inside start and test calls during the last backward
  SyncTimes times_;
};

}  // namespace zaya::train
