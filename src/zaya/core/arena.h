// Arena: one allocation made at start-up, handed out in 64-byte-aligned pieces during a step and
// rewound afterwards, so the training loop allocates nothing (DESIGN.md, "No allocation in the
// step"). Tensors from an arena are valid until the arena is rewound past them.
#pragma once

#include <cstddef>
#include <memory>

#include "zaya/core/tensor.h"

namespace zaya {

class Arena {
 public:
  Arena() = default;
  Arena(size_t capacity_bytes, Device device = Device::cpu);

  Tensor alloc(const Shape& shape, DType dtype);
  Tensor alloc_zeros(const Shape& shape, DType dtype);

  size_t mark() const { return used_; }     // position to rewind to later
  void rewind(size_t mark);                 // frees everything allocated after `mark`
  void reset() { rewind(0); }

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return storage_ ? storage_->bytes : 0; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// Alignment of every arena allocation: a cache line and an AVX-512 vector.
constexpr size_t kArenaAlign = 64;

}  // namespace zaya
