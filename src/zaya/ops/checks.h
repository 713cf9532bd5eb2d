// Argument checks and device dispatch shared by every op front (src/zaya/ops/<family>.cc).
//
// A front checks its arguments once per call, for any device: definedness, dtypes, shapes and that
// every tensor of the call lives on one device. The checks read shapes, dtypes and devices only,
// never tensor memory, so they hold unchanged for a CUDA kernel. Every failure is a zaya::Error
// naming the op, the argument, what was expected and what was found (docs/CONTRIBUTING.md, "The
// error story"). Checks that must read values (token ids in range, expert choices) belong to the
// backend that can read them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya::ops {

// One tensor argument of an op call, named as in the op's declaration (for error messages).
struct TensorArg {
  std::string_view name;
  const Tensor& tensor;
};

// The device an op call runs on: the device of its defined tensor arguments, which must all agree.
// Undefined tensors (optional outputs, a missing bias) are skipped. The front then branches:
//
//   const OpDevice on("rmsnorm_forward", {{"x", x}, {"w", w}, {"y", y}, {"rstd", rstd}});
//   ...checks...
//   if (on.cpu()) return cpu::rmsnorm_forward(x, w, eps, y, rstd);
//   on.no_kernel();  // a CUDA kernel adds: if (on.cuda()) return cuda::rmsnorm_forward(...);
class OpDevice {
 public:
  // Throws "<op>: <arg> is <tensor>, but <first arg> is <tensor>: ..." when two defined tensor
  // arguments are on different devices.
  explicit OpDevice(std::string_view op) : op_(op) {}
  OpDevice(std::string_view op, std::initializer_list<TensorArg> args);
  // The same for a list of tensors named "<what> <index>" (the gradients of a norm).
  OpDevice(std::string_view op, std::string_view what, std::span<const Tensor> list);

  // Adds one more tensor argument: `name`, or list[index]field (problems[3].A), the name formatted
  // only for an error message or the first defined argument.
  void add(std::string_view name, const Tensor& t);
  void add(std::string_view list, size_t index, std::string_view field, const Tensor& t);

  Device device() const { return device_; }
  // On the emulated device (cuda_runtime.h) a CUDA call runs the CPU kernel: cpu() is true,
  // cuda() false, and device memory is open to the kernel until this object ends.
  bool cpu() const;
  bool cuda() const { return device_ == Device::cuda && !cuda::emulated(); }

  // Throws "no CUDA kernel for ops::<op> yet (<first arg> is <tensor>)": the call reached a device
  // whose backend does not have this op yet.
  [[noreturn]] void no_kernel() const;

 private:
  // "<dtype>[<shape>] <device>" of the first defined argument, as Tensor::str() writes it.
  std::string first_str() const;

  std::string_view op_;
  Device device_ = Device::cpu;
  mutable std::optional<cuda::EmulatedKernelScope> emulated_kernel_;
  // The first defined argument, kept by value (the tensor may be a temporary of the caller's).
  bool any_ = false;
  std::string first_name_;
  Shape first_shape_;
  DType first_dtype_ = DType::f32;
};

namespace check {

void defined(std::string_view op, std::string_view what, const Tensor& t);
// Defined, of dtype `dt`.
void dtype(std::string_view op, std::string_view what, const Tensor& t, DType dt);
inline void f32(std::string_view op, std::string_view what, const Tensor& t) {
  dtype(op, what, t, DType::f32);
}
inline void i32(std::string_view op, std::string_view what, const Tensor& t) {
  dtype(op, what, t, DType::i32);
}

// Exactly this shape.
void shape(std::string_view op, std::string_view what, const Tensor& t, const Shape& s);
// a with b's shape: "<op>: <what> vs <other>: shapes [..] and [..] differ".
void same_shape(std::string_view op, std::string_view what, const Tensor& a, std::string_view other,
                const Tensor& b);
// f32 with exactly this shape (weights, tables, caches).
void exact(std::string_view op, std::string_view what, const Tensor& t, const Shape& s);
// f32 [f].
void vector(std::string_view op, std::string_view what, const Tensor& t, int64_t f);

// An f32 activation of B·T rows of F features, as [B, T, F], [B·T, F] or, for per-head data,
// [B, T, heads, hd] with heads·hd = F: all are the same contiguous bytes.
void rows(std::string_view op, std::string_view what, const Tensor& t, int64_t B, int64_t T, int64_t F);
// N rows of F features for a per-token op, f32: [N, F], [B, T, F] or [B, T, heads, hd] with the
// right product (the op does not care how the rows are grouped).
void n_rows(std::string_view op, std::string_view what, const Tensor& t, int64_t N, int64_t F);

void positive(std::string_view op, std::string_view what, int64_t v);

}  // namespace check
}  // namespace zaya::ops
