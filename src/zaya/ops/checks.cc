// The shared argument checks and the device of an op call (see checks.h).
#include "zaya/ops/checks.h"

namespace zaya::ops {

OpDevice::OpDevice(std::string_view op, std::initializer_list<TensorArg> args) : op_(op) {
  for (const TensorArg& a : args) add(a.name, a.tensor);
}

OpDevice::OpDevice(std::string_view op, std::string_view what, std::span<const Tensor> list) : op_(op) {
  for (size_t i = 0; i < list.size(); ++i)
    if (!any_ || list[i].device() != device_) add(str(what, " ", i), list[i]);
}

void OpDevice::add(std::string_view name, const Tensor& t) {
  if (!t.defined()) return;
  if (!any_) {
    any_ = true;
    first_name_ = name;
    first_shape_ = t.shape();
    first_dtype_ = t.dtype();
    device_ = t.device();
    return;
  }
  // On the emulated device, a CPU kernel that calls other ops mixes its host scratch with the
  // (host-backed) device tensors it was given: those inner calls are the kernel's business.
  if (t.device() != device_ && cuda::emulated() && cuda::in_emulated_kernel()) return;
  ZAYA_CHECK(t.device() == device_, op_, ": ", name, " is ", t.str(), ", but ", first_name_, " is ", first_str(),
             ": every tensor of one call must be on the same device");
}

void OpDevice::add(std::string_view list, size_t index, std::string_view field, const Tensor& t) {
  if (!t.defined() || (any_ && t.device() == device_)) return;
  add(str(list, "[", index, "]", field), t);
}

bool OpDevice::cpu() const {
  if (device_ == Device::cpu) return true;
  if (device_ != Device::cuda || !cuda::emulated()) return false;
  if (!emulated_kernel_) emulated_kernel_.emplace();
  return true;
}

std::string OpDevice::first_str() const {
  return str(dtype_name(first_dtype_), first_shape_.str(), " ", device_name(device_));
}

void OpDevice::no_kernel() const {
  const std::string_view backend = device_ == Device::cuda ? "CUDA" : "CPU";
  if (!any_) throw Error(str("no ", backend, " kernel for ops::", op_, " yet"));
  throw Error(str("no ", backend, " kernel for ops::", op_, " yet (", first_name_, " is ", first_str(), ")"));
}

namespace check {

void defined(std::string_view op, std::string_view what, const Tensor& t) {
  ZAYA_CHECK(t.defined(), op, ": ", what, " is not defined");
}

void dtype(std::string_view op, std::string_view what, const Tensor& t, DType dt) {
  defined(op, what, t);
  ZAYA_CHECK(t.dtype() == dt, op, ": ", what, " must be ", dtype_name(dt), ", found ", t.str());
}

void shape(std::string_view op, std::string_view what, const Tensor& t, const Shape& s) {
  if (!(t.shape() == s)) zaya::check_shape(str(op, ": ", what), t, s);  // the message only on failure
}

void same_shape(std::string_view op, std::string_view what, const Tensor& a, std::string_view other,
                const Tensor& b) {
  if (!(a.shape() == b.shape())) zaya::check_same_shape(str(op, ": ", what, " vs ", other), a, b);
}

void exact(std::string_view op, std::string_view what, const Tensor& t, const Shape& s) {
  f32(op, what, t);
  shape(op, what, t, s);
}

void vector(std::string_view op, std::string_view what, const Tensor& t, int64_t f) {
  exact(op, what, t, Shape{f});
}

void rows(std::string_view op, std::string_view what, const Tensor& t, int64_t B, int64_t T, int64_t F) {
  f32(op, what, t);
  const Shape& s = t.shape();
  const bool ok = (s == Shape{B, T, F}) || (s == Shape{B * T, F}) ||
                  (s.ndim() == 4 && s[0] == B && s[1] == T && s[2] * s[3] == F);
  if (!ok) shape(op, what, t, Shape{B, T, F});
}

void n_rows(std::string_view op, std::string_view what, const Tensor& t, int64_t N, int64_t F) {
  f32(op, what, t);
  const Shape& s = t.shape();
  const bool ok = t.numel() == N * F && s.ndim() >= 2 &&
                  (s[s.ndim() - 1] == F || (s.ndim() >= 3 && s[s.ndim() - 1] * s[s.ndim() - 2] == F));
  if (!ok) shape(op, what, t, Shape{N, F});
}

void positive(std::string_view op, std::string_view what, int64_t v) {
  ZAYA_CHECK(v > 0, op, ": ", what, " must be positive, found ", v);
}

}  // namespace check
}  // namespace zaya::ops
