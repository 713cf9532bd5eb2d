#include "zaya/core/arena.h"

namespace zaya {

Arena::Arena(size_t capacity_bytes, Device device)
    : storage_(allocate_storage(capacity_bytes, device)) {}

Tensor Arena::alloc(const Shape& shape, DType dtype) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  size_t start = (used_ + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  ZAYA_CHECK(storage_ && start + bytes <= storage_->bytes, "arena exhausted: ", dtype_name(dtype),
             shape.str(), " needs ", bytes, " bytes at offset ", start, " of ", capacity(),
             " (size the arena from the config's activation estimate)");
  used_ = start + bytes;
  if (used_ > peak_) peak_ = used_;
  return Tensor::over(storage_, start, shape, dtype);
}

Tensor Arena::alloc_zeros(const Shape& shape, DType dtype) {
  Tensor t = alloc(shape, dtype);
  t.zero_();
  return t;
}

void Arena::rewind(size_t mark) {
  ZAYA_ASSERT(mark <= used_, "rewind forward from ", used_, " to ", mark);
  used_ = mark;
}

}  // namespace zaya
