// RoPE tables, argument checks and dispatch (kernel in cpu/rope_cpu.cc).
#include "zaya/ops/rope.h"

#include <cmath>
#include <vector>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/rope_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/sequence_cuda.h"
#endif

namespace zaya::ops {

RopeTable make_rope_table(int64_t head_dim, double partial_rotary_factor, double theta,
                          int64_t max_positions, Device device) {
  constexpr std::string_view op = "make_rope_table";
  check::positive(op, "head_dim", head_dim);
  check::positive(op, "max_positions", max_positions);
  ZAYA_CHECK(partial_rotary_factor > 0 && partial_rotary_factor <= 1, op,
             ": partial_rotary_factor must be in (0, 1], found ", partial_rotary_factor);
  ZAYA_CHECK(theta > 0, op, ": rope_theta must be positive, found ", theta);
  RopeTable t;
  // python's int(): truncation of head_dim·factor (computed in double, like python floats).
  t.rot = static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  ZAYA_CHECK(t.rot >= 2 && t.rot % 2 == 0, op, ": rotary dims int(head_dim·partial_rotary_factor) = ", t.rot,
             " must be even and >= 2 (head_dim ", head_dim, ", factor ", partial_rotary_factor, ")");
  const int64_t half = t.rot / 2;
  t.cos = Tensor::empty(Shape{max_positions, half}, DType::f32);
  t.sin = Tensor::empty(Shape{max_positions, half}, DType::f32);
  // torch: arange(0, rot, 2, float32) / rot → float32 exponent; θ ** e in float32; 1.0 / that.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const float base = static_cast<float>(theta);
  for (int64_t j = 0; j < half; ++j) {
    float e = static_cast<float>(2 * j) / static_cast<float>(t.rot);
    inv_freq[j] = 1.0f / std::pow(base, e);
  }
  float* c = t.cos.data<float>();
  float* s = t.sin.data<float>();
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t j = 0; j < half; ++j) {
      float angle = static_cast<float>(p) * inv_freq[j];  // float32 product, as the reference
      c[p * half + j] = static_cast<float>(std::cos(static_cast<double>(angle)));
      s[p * half + j] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  if (device != Device::cpu) {
    t.cos = t.cos.to(device);
    t.sin = t.sin.to(device);
  }
  return t;
}

namespace {
void rope_run(std::string_view op, const Tensor& y, const Tensor& x, const RopeTable& table, int64_t B, int64_t T,
              int64_t heads, int64_t hd, int64_t pos_offset, float sign, const char* xname,
              const char* yname) {
  const OpDevice on(op, {{yname, y}, {xname, x}, {"cos table", table.cos}, {"sin table", table.sin}});
  check::positive(op, "B", B);
  check::positive(op, "T", T);
  check::positive(op, "heads", heads);
  check::positive(op, "hd", hd);
  ZAYA_CHECK(pos_offset >= 0, op, ": pos_offset must be >= 0, found ", pos_offset);
  ZAYA_CHECK(table.rot >= 2 && table.rot <= hd, op, ": table has ", table.rot, " rotary dims, head_dim is ",
             hd);
  check::exact(op, "cos table", table.cos, Shape{table.max_positions(), table.rot / 2});
  check::exact(op, "sin table", table.sin, Shape{table.max_positions(), table.rot / 2});
  ZAYA_CHECK(pos_offset + T <= table.max_positions(), op, ": positions up to ", pos_offset + T - 1,
             " exceed the table's ", table.max_positions(), " positions (max_position_embeddings)");
  check::rows(op, xname, x, B, T, heads * hd);
  check::rows(op, yname, y, B, T, heads * hd);
  if (on.cpu())
    return cpu::rope_apply(y.data<float>(), x.data<float>(), table.cos.data<float>(), table.sin.data<float>(),
                           table.rot, B, T, heads, hd, pos_offset, sign);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::rope_apply(y, x, table, B, T, heads, hd, pos_offset, sign);
#endif
  on.no_kernel();
}
}  // namespace

void rope_forward(const Tensor& y, const Tensor& x, const RopeTable& table, int64_t B, int64_t T, int64_t heads,
                  int64_t hd, int64_t pos_offset) {
  rope_run("rope_forward", y, x, table, B, T, heads, hd, pos_offset, 1.0f, "x", "y");
}

void rope_backward(const Tensor& dx, const Tensor& dy, const RopeTable& table, int64_t B, int64_t T, int64_t heads,
                   int64_t hd, int64_t pos_offset) {
  rope_run("rope_backward", dx, dy, table, B, T, heads, hd, pos_offset, -1.0f, "dy", "dx");
}

}  // namespace zaya::ops
