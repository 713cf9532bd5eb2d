// Context parallelism as the model sees it (docs/context-parallel.md): the zigzag layout of a
// sequence over the cp ranks of a group, and the two exchanges the model needs from the group.
//
// Layout. A sequence of S tokens is cut into 2K chunks of c = S/(2K) tokens; rank i of K holds
// chunks i and 2K−1−i (the causal work of the early chunk and the late chunk balance). Each batch
// row of a rank's input is [chunk i | chunk 2K−1−i] (2c tokens); positions (RoPE, the causal mask)
// stay global.
//
// The model stays math only: it never knows how the exchanges travel (MPI, NCCL, threads in a test).
// Everything per token is local; CCA's convolutions and value shift take a halo of the two tokens
// before each chunk, and attention reads every earlier key and value, which the ranks all-gather.
#pragma once

#include <cstdint>
#include <memory>

#include "zaya/core/tensor.h"

namespace zaya::model {

// An exchange in flight, from ContextGroup::start_*. wait() returns once it has completed on this
// rank: recv may be read and send changed (until then the caller reads neither recv nor writes
// send). test() says whether it has completed without blocking; a backend that moves data only
// inside its own calls (MPI's non-blocking collectives on a single-threaded library) progresses in
// it, so a caller with compute to do polls test() between its pieces. A default-constructed (or
// waited, or moved-from) Exchange is complete. Destroying one that was never waited waits for it.
class Exchange {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;
    virtual void wait() = 0;
  };
  Exchange() = default;
  explicit Exchange(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Exchange(Exchange&&) noexcept = default;
  Exchange& operator=(Exchange&&) noexcept = default;
  bool test() { return !impl_ || impl_->test(); }
  void wait() {
    if (!impl_) return;
    impl_->wait();
    impl_.reset();
  }
  bool pending() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The group of ranks that share one sequence. Tensors are f32 on the model's device; every rank
// issues the exchanges (start_* and the blocking forms alike) in the same order with tensors of
// the same sizes. Several may be in flight at once; they may be waited in any order.
class ContextGroup {
 public:
  virtual ~ContextGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv [size · n] ← every rank's send [n], in rank order.
  virtual Exchange start_all_gather(const Tensor& recv, const Tensor& send) = 0;
  // recv [n] ← Σ over ranks of their send[rank() · n, (rank() + 1) · n) (send holds size · n).
  virtual Exchange start_reduce_scatter(const Tensor& recv, const Tensor& send) = 0;
  // The blocking forms: start, then wait.
  void all_gather(const Tensor& recv, const Tensor& send) { start_all_gather(recv, send).wait(); }
  void reduce_scatter(const Tensor& recv, const Tensor& send) { start_reduce_scatter(recv, send).wait(); }
};

// How a layer's attention meets the K/V exchange (docs/context-parallel.md, "Overlap").
//   blocking:   gather every rank's K/V, then each chunk against all of its keys in one pass;
//               backward gathers again and reduce-scatters dK/dV after the whole attention backward.
//   overlapped: each chunk against its own keys while the gather is in flight, then against the
//               keys before it, merged by log-sum-exp; backward's gather is issued at the start of
//               the layer's backward, and the reduce-scatter of the keys-before part runs while
//               the chunks' own-keys backward computes. Equal to blocking within fp32 rounding of
//               the regrouped softmax sums (the merge), not bitwise.
enum class CpSchedule { blocking, overlapped };

// The global chunk held as segment `seg` (0: the early one, 1: the late one) by `rank` of `cp`.
inline int64_t zigzag_chunk(int64_t rank, int64_t seg, int64_t cp) {
  return seg == 0 ? rank : 2 * cp - 1 - rank;
}
// The rank and segment that hold global chunk j.
inline int64_t zigzag_owner(int64_t j, int64_t cp) { return j < cp ? j : 2 * cp - 1 - j; }
inline int64_t zigzag_segment(int64_t j, int64_t cp) { return j < cp ? 0 : 1; }

// Tokens per chunk; throws zaya::Error naming parallel.cp and the sequence length when the
// sequence does not split into 2·cp equal chunks.
int64_t zigzag_chunk_len(int64_t seq_len, int64_t cp);

// Rank `rank`'s part of rows [B, S] (any 4-byte dtype, host memory): out [B, S/cp] with each row
// [chunk rank | chunk 2cp−1−rank]. What the loader hands a cp rank (ids and targets alike).
void zigzag_select(const Tensor& out, const Tensor& rows, int64_t rank, int64_t cp);
// The inverse for tests and tools: scatters rank's part [B, S/cp] back into rows [B, S].
void zigzag_place(const Tensor& rows, const Tensor& part, int64_t rank, int64_t cp);

}  // namespace zaya::model
