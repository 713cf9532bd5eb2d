#include "zaya/train/context_group.h"

#include "zaya/core/error.h"

namespace zaya::train {

void CommContextGroup::all_gather(const Tensor& recv, const Tensor& send) {
  const int64_t n = send.numel(), k = comm_.size();
  ZAYA_CHECK(send.dtype() == DType::f32 && recv.dtype() == DType::f32 && recv.numel() == n * k,
             "context-parallel all-gather: expected f32 send [n] and recv [", k, " x n], found ", send.str(),
             " and ", recv.str());
  comm_.all_gather(send.raw(), recv.raw(), static_cast<size_t>(n), DType::f32);
  bytes_ += 4.0 * static_cast<double>(n * (k - 1));
  ++calls_;
}

void CommContextGroup::reduce_scatter(const Tensor& recv, const Tensor& send) {
  const int64_t n = recv.numel(), k = comm_.size();
  ZAYA_CHECK(send.dtype() == DType::f32 && recv.dtype() == DType::f32 && send.numel() == n * k,
             "context-parallel reduce-scatter: expected f32 send [", k, " x n] and recv [n], found ",
             send.str(), " and ", recv.str());
  comm_.reduce_scatter(send.raw(), recv.raw(), static_cast<size_t>(n), DType::f32);
  bytes_ += 4.0 * static_cast<double>(n * (k - 1));
  ++calls_;
}

}  // namespace zaya::train
