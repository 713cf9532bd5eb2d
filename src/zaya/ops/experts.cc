// Argument checks and dispatch for the experts (kernels in cpu/experts_cpu.cc and cuda/experts.cu).
#include "zaya/ops/experts.h"

#include <utility>

#include "zaya/ops/checks.h"
#include "zaya/ops/cpu/experts_cpu.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/experts_cuda.h"
#endif

namespace zaya::ops {
namespace {

// At least `rows` rows of `cols` columns, 2-D, of dtype dt.
void require_rows_at_least(std::string_view op, std::string_view what, const Tensor& t, int64_t rows,
                           int64_t cols, DType dt) {
  check::dtype(op, what, t, dt);
  ZAYA_CHECK(t.ndim() == 2 && t.size(1) == cols && t.size(0) >= rows, op, ": ", what, " has shape ",
             t.shape().str(), ", expected [>=", rows, ", ", cols, "]");
}

struct Dims {
  int64_t E, H, I;
};

// The weights fix E, H and I; everything else is checked against them.
Dims check_weights(std::string_view op, const ExpertWeights& w, const char* what, const char* down) {
  ZAYA_CHECK(w.gate_up.defined() && w.down.defined(), op, ": ", what, " gate_up and down must be defined");
  ZAYA_CHECK(w.gate_up.ndim() == 3 && w.gate_up.size(1) % 2 == 0, op, ": ", what,
             ".gate_up must be [E, 2I, H], found ", w.gate_up.str());
  const Dims d{w.gate_up.size(0), w.gate_up.size(2), w.gate_up.size(1) / 2};
  ZAYA_CHECK(w.gate_up.dtype() == DType::f32 || w.gate_up.dtype() == DType::bf16, op, ": ", what,
             ".gate_up must be f32 or bf16, found ", w.gate_up.str());
  check::dtype(op, down, w.down, w.gate_up.dtype());
  check::shape(op, down, w.down, Shape{d.E, d.H, d.I});
  return d;
}

void check_plan(std::string_view op, const Tensor& offsets, int64_t M, const Dims& d) {
  check::i32(op, "offsets", offsets);
  check::shape(op, "offsets", offsets, Shape{d.E + 1});
  ZAYA_CHECK(M >= 0, op, ": routed rows M must be >= 0, found ", M);
}

void check_acts(std::string_view op, const ExpertActs& a, int64_t M, const Dims& d, bool b16) {
  require_rows_at_least(op, "xp", a.xp, M, d.H, DType::f32);
  require_rows_at_least(op, "gu", a.gu, M, 2 * d.I, DType::f32);
  require_rows_at_least(op, "act", a.act, M, d.I, DType::f32);
  require_rows_at_least(op, "y", a.y, M, d.H, DType::f32);
  if (b16) {
    require_rows_at_least(op, "xp16 (bf16 weights need it)", a.xp16, M, d.H, DType::bf16);
    require_rows_at_least(op, "act16 (bf16 weights need it)", a.act16, M, d.I, DType::bf16);
  }
  if (a.gu16.defined()) require_rows_at_least(op, "gu16", a.gu16, M, 2 * d.I, DType::bf16);
  if (a.y16.defined()) require_rows_at_least(op, "y16", a.y16, M, d.H, DType::bf16);
}

}  // namespace

void experts_forward(const ExpertActs& a, const Tensor& x, const Tensor& src, const Tensor& offsets,
                     const ExpertWeights& w, int64_t M) {
  constexpr std::string_view op = "experts_forward";
  const OpDevice on(op, {{"x", x},          {"src", src},     {"offsets", offsets}, {"weights.gate_up", w.gate_up},
                         {"weights.down", w.down}, {"xp", a.xp}, {"gu", a.gu},       {"act", a.act},
                         {"y", a.y},        {"xp16", a.xp16}, {"act16", a.act16}, {"gu16", a.gu16},
                         {"y16", a.y16}});
  const Dims d = check_weights(op, w, "weights", "weights.down");
  check_plan(op, offsets, M, d);
  check::f32(op, "x", x);
  ZAYA_CHECK(x.ndim() == 2 && x.size(1) == d.H && x.size(0) >= M, op, ": x has shape ", x.shape().str(),
             ", expected [N >= M = ", M, ", ", d.H, "]");
  check::i32(op, "src", src);
  check::shape(op, "src", src, Shape{x.size(0)});
  check_acts(op, a, M, d, w.gate_up.dtype() == DType::bf16);
  if (on.cpu()) return cpu::experts_forward(a, x, src, offsets, w, M);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::experts_forward(a, x, src, offsets, w, M);
#endif
  on.no_kernel();
}

bool experts_backward(const Tensor& dxp, const ExpertWeights& grads, const Tensor& dy, const Tensor& offsets,
                      const ExpertWeights& w, const ExpertActs& a, const ExpertScratch& scratch,
                      int64_t M, std::span<SideTask> side) {
  constexpr std::string_view op = "experts_backward";
  OpDevice on(op, {{"dy", dy},
                   {"dxp", dxp},
                   {"offsets", offsets},
                   {"weights.gate_up", w.gate_up},
                   {"weights.down", w.down},
                   {"grads.gate_up", grads.gate_up},
                   {"grads.down", grads.down}});
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"xp", &a.xp}, {"gu", &a.gu}, {"act", &a.act},
                                {"y", &a.y}, {"xp16", &a.xp16}, {"act16", &a.act16}, {"gu16", &a.gu16},
                                {"y16", &a.y16}, {"dact", &scratch.dact},
                                {"dgu", &scratch.dgu}, {"dy16", &scratch.dy16}, {"dgu16", &scratch.dgu16}})
    on.add(name, *t);
  const Dims d = check_weights(op, w, "weights", "weights.down");
  const Dims dg = check_weights(op, grads, "grads", "grads.down");
  ZAYA_CHECK(grads.gate_up.dtype() == DType::f32, op, ": weight gradients must be f32, found ",
             grads.gate_up.str());
  ZAYA_CHECK(dg.E == d.E && dg.H == d.H && dg.I == d.I, op, ": grads ", grads.gate_up.shape().str(),
             " do not match weights ", w.gate_up.shape().str());
  check_plan(op, offsets, M, d);
  const bool b16 = w.gate_up.dtype() == DType::bf16;
  check_acts(op, a, M, d, b16);
  require_rows_at_least(op, "dy", dy, M, d.H, DType::f32);
  require_rows_at_least(op, "dxp", dxp, M, d.H, DType::f32);
  require_rows_at_least(op, "dact", scratch.dact, M, d.I, DType::f32);
  require_rows_at_least(op, "dgu", scratch.dgu, M, 2 * d.I, DType::f32);
  if (b16) {
    require_rows_at_least(op, "dy16 (bf16 weights need it)", scratch.dy16, M, d.H, DType::bf16);
    require_rows_at_least(op, "dgu16 (bf16 weights need it)", scratch.dgu16, M, 2 * d.I, DType::bf16);
  }
  for (const SideTask& t : side) ZAYA_CHECK(t.run != nullptr, op, ": a side task has no function");
  if (on.cpu()) return cpu::experts_backward(dxp, grads, dy, offsets, w, a, scratch, M, side);
#if defined(ZAYA_HAVE_CUDA)
  if (on.cuda()) return cuda::experts_backward(dxp, grads, dy, offsets, w, a, scratch, M);
#endif
  on.no_kernel();
}

}  // namespace zaya::ops
