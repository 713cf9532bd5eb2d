#include "zaya/core/arena.h"

#include "zaya/core/cuda_context.h"

namespace zaya {

namespace {
// Names the arena in the error when it asks for device memory and no GPU can give it.
std::shared_ptr<Storage> arena_storage(size_t capacity_bytes, Device device) {
  if (device == Device::cuda) cuda::require_device(str("a CUDA arena of ", capacity_bytes, " bytes"));
  return allocate_storage(capacity_bytes, device);
}
}  // namespace

// One allocation (one cudaMalloc on a GPU) for the arena's life; alloc() hands out views into it.
Arena::Arena(size_t capacity_bytes, Device device) : storage_(arena_storage(capacity_bytes, device)) {}

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
