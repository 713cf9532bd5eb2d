#include "zaya/core/tensor.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"

namespace zaya {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::f64: return "f64";
  }
  return "?";
}

std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(Shape::of({dims.begin(), dims.size()})) {}

Shape Shape::of(std::span<const int64_t> dims) {
  ZAYA_CHECK(dims.size() <= kMaxDims, "a tensor has at most ", kMaxDims, " dims, got ", dims.size());
  Shape s;
  s.ndim_ = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    // -1 is allowed only as reshape's "infer this dim"; tensors themselves check for it.
    ZAYA_CHECK(dims[i] >= -1, "negative dimension ", dims[i], " at index ", i);
    s.dims_[i] = dims[i];
  }
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

namespace {
std::atomic<int64_t> g_in_use[2], g_peak[2];
int device_slot(Device d) { return d == Device::cpu ? 0 : 1; }
void count_allocation(Device d, int64_t bytes) {
  const int k = device_slot(d);
  const int64_t now = g_in_use[k].fetch_add(bytes) + bytes;
  int64_t peak = g_peak[k].load();
  while (now > peak && !g_peak[k].compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

size_t storage_bytes_in_use(Device device) { return static_cast<size_t>(g_in_use[device_slot(device)].load()); }
size_t storage_bytes_peak(Device device) { return static_cast<size_t>(g_peak[device_slot(device)].load()); }
void reset_storage_bytes_peak(Device device) {
  g_peak[device_slot(device)].store(g_in_use[device_slot(device)].load());
}

Storage::~Storage() {
  if (!owned || !ptr) return;
  count_allocation(device, -static_cast<int64_t>(bytes));
  if (pinned) cuda::free_pinned(ptr);
  else if (device == Device::cpu) std::free(ptr);
  else cuda::free_device(ptr);
}

std::shared_ptr<Storage> allocate_storage(size_t bytes, Device device) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = device;
  s->owned = true;
  if (bytes == 0) return s;
  if (device == Device::cpu) {
    // Large buffers (the activation arena, parameters and gradients, the loss's logits) are
    // 2 MiB-aligned and asked for transparent huge pages: streaming over tens of MB in 4 KiB pages
    // misses the TLB once per page. Kernels set to THP "madvise" (Debian's default) only give huge
    // pages to ranges that ask; "never" ignores the request, which is harmless.
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t align = bytes >= kHuge ? kHuge : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    s->ptr = std::aligned_alloc(align, rounded);
    ZAYA_CHECK(s->ptr != nullptr, "out of host memory allocating ", bytes, " bytes");
#if defined(MADV_HUGEPAGE)
    if (align == kHuge) madvise(s->ptr, rounded, MADV_HUGEPAGE);
#endif
  } else {
    s->ptr = cuda::malloc_device(bytes);
  }
  count_allocation(device, static_cast<int64_t>(bytes));
  return s;
}

void Tensor::check_host_access() const {
  // Only the emulated device can tell: its memory is host memory that host code could touch
  // without crashing, where a real GPU's would fault (or read garbage through a stale mapping).
  if (cuda::emulated() && !cuda::in_emulated_kernel())
    throw Error(zaya::str("host code read or wrote the memory of ", str(),
                          " outside an op: device tensors are reached through ops and copies only"));
}

std::shared_ptr<Storage> allocate_pinned_storage(size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->owned = true;
  s->pinned = true;
  s->ptr = cuda::malloc_pinned(bytes);
  count_allocation(Device::cpu, static_cast<int64_t>(bytes));
  return s;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  // The message is built only when no GPU can take the tensor.
  if (device == Device::cuda && cuda::device_count() == 0)
    cuda::require_device(zaya::str("a CUDA tensor ", dtype_name(dtype), shape.str()));
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return over(allocate_storage(bytes, device), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::borrow(void* ptr, const Shape& shape, DType dtype, Device device) {
  auto s = std::make_shared<Storage>();
  s->ptr = ptr;
  s->bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  s->device = device;
  s->owned = false;
  return over(std::move(s), 0, shape, dtype);
}

Tensor Tensor::over(std::shared_ptr<Storage> storage, size_t offset_bytes, const Shape& shape,
                    DType dtype) {
  ZAYA_ASSERT(storage != nullptr);
  for (int64_t d : shape) ZAYA_CHECK(d >= 0, "tensor shape ", shape.str(), " has a negative dimension");
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  ZAYA_CHECK(offset_bytes + bytes <= storage->bytes, "view of ", bytes, " bytes at offset ",
             offset_bytes, " exceeds storage of ", storage->bytes, " bytes");
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset_bytes;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::size(int dim) const {
  int d = dim < 0 ? dim + ndim() : dim;
  ZAYA_CHECK(d >= 0 && d < ndim(), "dim ", dim, " out of range for ", str());
  return shape_[d];
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->ptr) + offset_;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.ndim(); ++i) {
    if (s[i] == -1) {
      ZAYA_CHECK(infer < 0, "reshape ", shape.str(), ": at most one -1");
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    ZAYA_CHECK(known > 0 && numel() % known == 0, "cannot reshape ", shape_.str(), " to ", shape.str());
    s[infer] = numel() / known;
  }
  ZAYA_CHECK(s.numel() == numel(), "cannot reshape ", shape_.str(), " (", numel(), " elements) to ",
             s.str());
  return over(storage_, offset_, s, dtype_);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  ZAYA_CHECK(ndim() >= 1, "slice of a 0-d tensor");
  ZAYA_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end,
             ") out of range for ", shape_.str());
  Shape s = shape_;
  s[0] = end - begin;
  int64_t row = shape_[0] ? numel() / shape_[0] : 0;
  return over(storage_, offset_ + static_cast<size_t>(begin * row) * dtype_size(dtype_), s, dtype_);
}

Tensor Tensor::select(int64_t index) const {
  Tensor row = slice(index, index + 1);
  return row.reshape(Shape::of({shape_.begin() + 1, shape_.end()}));
}

Tensor Tensor::window(int64_t elem_offset, const Shape& shape) const {
  ZAYA_CHECK(elem_offset >= 0 && elem_offset + shape.numel() <= numel(), "window of ",
             shape.numel(), " elements at ", elem_offset, " exceeds ", str());
  return over(storage_, offset_ + static_cast<size_t>(elem_offset) * dtype_size(dtype_), shape, dtype_);
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return storage_ && storage_ == other.storage_;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

void Tensor::copy_from(const Tensor& src) {
  ZAYA_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: source ", src.str(),
             " does not match destination ", str());
  if (nbytes() == 0) return;
  if (device() == Device::cpu && src.device() == Device::cpu) {
    std::memmove(raw(), src.raw(), nbytes());
  } else {
    cuda::copy(raw(), device(), src.raw(), src.device(), nbytes());
  }
}

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (device() != Device::cpu) {
    cuda::memset_device(raw(), 0, nbytes());
    return;
  }
  // Large buffers (a model's flat gradients, zeroed every optimizer step) in 1 MiB pieces over
  // the threads: one core's stores do not fill the memory bus.
  constexpr size_t kPiece = size_t{1} << 20;
  const size_t n = nbytes();
  auto* p = static_cast<char*>(raw());
  if (n < 8 * kPiece || omp_in_parallel()) {
    std::memset(p, 0, n);
    return;
  }
  const auto pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t begin = static_cast<size_t>(i) * kPiece;
    std::memset(p + begin, 0, std::min(kPiece, n - begin));
  }
}

void Tensor::fill_(double value) {
  ZAYA_CHECK(device() == Device::cpu, "fill_ is CPU-only; fill on the host and copy");
  int64_t n = numel();
  switch (dtype_) {
    case DType::f32: { float* p = data<float>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value); break; }
    case DType::bf16: { bf16 v = to_bf16(static_cast<float>(value)); bf16* p = data<bf16>(); for (int64_t i = 0; i < n; ++i) p[i] = v; break; }
    case DType::i32: { int32_t* p = data<int32_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value); break; }
    case DType::i64: { int64_t* p = data<int64_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value); break; }
    case DType::u8: { uint8_t* p = data<uint8_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(value); break; }
    case DType::f64: { double* p = data<double>(); for (int64_t i = 0; i < n; ++i) p[i] = value; break; }
  }
}

std::string Tensor::str() const {
  return zaya::str(dtype_name(dtype_), shape_.str(), " ", device_name(device()));
}

void check_shape(std::string_view what, const Tensor& t, const Shape& expected) {
  if (!(t.shape() == expected))
    throw Error(str(what, " has shape ", t.shape().str(), ", expected ", expected.str()));
}

void check_dtype(std::string_view what, const Tensor& t, DType expected) {
  if (t.dtype() != expected)
    throw Error(str(what, " has dtype ", dtype_name(t.dtype()), ", expected ", dtype_name(expected)));
}

void check_same_shape(std::string_view what, const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape()))
    throw Error(str(what, ": shapes ", a.shape().str(), " and ", b.shape().str(), " differ"));
}

}  // namespace zaya
