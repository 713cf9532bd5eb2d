// Tensor: a contiguous, row-major view of up to five dimensions over shared storage.
//
// There is no autograd and no strides: every op takes and returns contiguous tensors, and views
// (reshape, slice along the first dimension, a window into a flat buffer) share storage with the
// tensor they came from. This is what lets all parameters live in one flat buffer with each
// parameter a named view (DESIGN.md, "Engine principles").
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "zaya/core/dtype.h"
#include "zaya/core/error.h"

namespace zaya {

constexpr int kMaxDims = 5;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape of(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

// A block of memory on one device. Owned storage frees itself; borrowed storage (arena slices,
// external buffers) frees nothing.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device = Device::cpu;
  bool owned = false;
  bool pinned = false;  // page-locked host memory (cuda::malloc_pinned)
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

// Allocates `bytes` on `device`, 64-byte aligned on the CPU. Throws zaya::Error on failure.
std::shared_ptr<Storage> allocate_storage(size_t bytes, Device device);
// Page-locked host memory for device-to-host copies (a checkpoint's staging block).
std::shared_ptr<Storage> allocate_pinned_storage(size_t bytes);

// Bytes of tensor storage zaya holds on `device` now, and the most it held since the last reset
// (what a run's summary reports as its measured peak; libraries' own workspaces, cuBLASLt's and
// cuDNN's, are not tensors and not counted).
size_t storage_bytes_in_use(Device device);
size_t storage_bytes_peak(Device device);
void reset_storage_bytes_peak(Device device);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu);
  // A tensor over memory zaya does not own; the caller keeps it alive.
  static Tensor borrow(void* ptr, const Shape& shape, DType dtype, Device device = Device::cpu);
  // A tensor over part of existing storage, starting `offset_bytes` in.
  static Tensor over(std::shared_ptr<Storage> storage, size_t offset_bytes, const Shape& shape,
                     DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu; }
  void* raw() const;

  // Typed pointer; throws if T does not match the tensor's dtype.
  template <class T>
  T* data() const {
    ZAYA_CHECK(dtype_ == dtype_of<T>::value, "tensor of dtype ", dtype_name(dtype_),
               " accessed as ", dtype_name(dtype_of<T>::value));
    if (storage_ && storage_->device != Device::cpu) check_host_access();
    return static_cast<T*>(raw());
  }

  // Views: share storage with this tensor.
  Tensor reshape(const Shape& shape) const;           // same numel; one dim may be -1
  Tensor slice(int64_t begin, int64_t end) const;     // rows [begin, end) of dim 0
  Tensor select(int64_t index) const;                 // row `index` of dim 0, one dim fewer
  Tensor window(int64_t elem_offset, const Shape& shape) const;  // flat sub-range, new shape
  bool shares_storage_with(const Tensor& other) const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Copies (host<->device as needed). copy_from requires equal numel and dtype.
  Tensor to(Device device) const;
  Tensor clone() const;
  void copy_from(const Tensor& src);
  void zero_();
  void fill_(double value);  // f32/bf16/i32/i64/u8, CPU only

  std::string str() const;  // "f32[2, 3] cpu"

 private:
  // On the emulated device (cuda_runtime.h), throws when host code outside an op reaches device
  // memory through data<T>(); nothing otherwise (CUDA kernels take their device pointers here).
  void check_host_access() const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::f32;
};

// Throws "<what> has shape [..], expected [..]" when shapes differ.
void check_shape(std::string_view what, const Tensor& t, const Shape& expected);
void check_dtype(std::string_view what, const Tensor& t, DType expected);
void check_same_shape(std::string_view what, const Tensor& a, const Tensor& b);

}  // namespace zaya
