// The experts of one layer, forward and backward (DESIGN.md, "Experts"): on the M routed rows
// (t.xp, gathered and grouped by expert via t.offsets),
//   gu_e = xp_e · W_gu[e]ᵀ (gate rows first);  act = SiLU(g) ⊙ v;  y_e = act_e · W_d[e]ᵀ.
//
// Two ways to run them, with the same bits:
//  * Grouped (expert_forward, expert_backward): each step is one pass over every expert (a
//    grouped GEMM call, then SwiGLU over all M rows, then the next grouped call).
//  * Fused (expert_forward_fused, expert_backward_fused): one task per expert runs all of that
//    expert's steps, taken by the threads as they free up, so the expert's intermediates ([g; v]:
//    1 MiB for the demo's ~256 rows) are still in the core's L2 when the next step reads them,
//    and a layer has one parallel region instead of three to five. Each GEMM runs on one thread
//    through the path a side-by-side grouped call gives it (ops::gemm_grouped_on_this_thread), so
//    the results are the grouped way's. Used in f32 for experts with small weights (those the
//    grouped calls run side by side too) when the plan keeps the threads even; the grouped way
//    otherwise (bf16, ZAYA1's large experts, very uneven loads, one thread).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "zaya/core/parallel.h"
#include "zaya/core/threads.h"
#include "zaya/model/model_internal.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/moe.h"

namespace zaya::model {

// The grouped way, forward. On the bf16 path the GEMM inputs are bf16 copies (xp16, act16, and
// the refreshed weight copies).
void ZayaModel::expert_forward(int l) {
  LayerActs& t = acts_[l];
  const LayerParams& p = lp_[l];
  const bool b16 = gemm_dtype_ == DType::bf16;
  const int64_t E = cfg_.num_experts, M = t.M;
  const int32_t* off = t.offsets.data<int32_t>();
  if (b16) ops::cast_to_bf16(t.xp.slice(0, M), t.xp16.slice(0, M));
  const Tensor& xp = b16 ? t.xp16 : t.xp;
  const Tensor& wgu = b16 ? w_gu16_[l] : p.w_gu;
  const Tensor& wd = b16 ? w_d16_[l] : p.w_d;
  problems_.clear();
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e])
      problems_.push_back({xp.slice(off[e], off[e + 1]), wgu.select(e), t.gu.slice(off[e], off[e + 1])});
  ops::gemm_grouped(problems_, ops::Trans::N, ops::Trans::T);
  ops::swiglu_forward(t.gu.slice(0, M), t.act.slice(0, M));
  if (b16) ops::cast_to_bf16(t.act.slice(0, M), t.act16.slice(0, M));
  const Tensor& act = b16 ? t.act16 : t.act;
  problems_.clear();
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e])
      problems_.push_back({act.slice(off[e], off[e + 1]), wd.select(e), t.y.slice(off[e], off[e + 1])});
  ops::gemm_grouped(problems_, ops::Trans::N, ops::Trans::T);
}

// The grouped way, backward. In: s.dy (dL/dy, permuted rows). Out: s.dxp; dW_d, dW_gu accumulated.
void ZayaModel::expert_backward(int l) {
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  LayerParams& g = lg_[l];
  const bool b16 = gemm_dtype_ == DType::bf16;
  const int64_t E = cfg_.num_experts, M = t.M;
  const int32_t* off = t.offsets.data<int32_t>();
  if (b16) ops::cast_to_bf16(s.dy.slice(0, M), s.dy16.slice(0, M));
  const Tensor& dy = b16 ? s.dy16 : s.dy;
  const Tensor& act = b16 ? t.act16 : t.act;
  const Tensor& xp = b16 ? t.xp16 : t.xp;
  const Tensor& wgu = b16 ? w_gu16_[l] : p.w_gu;
  const Tensor& wd = b16 ? w_d16_[l] : p.w_d;
  // Backward of every expert's linear y_e = x_e · W[e]ᵀ (experts with no tokens skipped):
  // dx_e = dy_e · W[e] (written), dW[e] += dy_eᵀ · x_e.
  auto expert_linear_backward = [&](const Tensor& dY, const Tensor& W, const Tensor& X, const Tensor& dX,
                                    const Tensor& dW) {
    problems_.clear();
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        problems_.push_back({dY.slice(off[e], off[e + 1]), W.select(e), dX.slice(off[e], off[e + 1])});
    ops::gemm_grouped(problems_, ops::Trans::N, ops::Trans::N);
    problems_.clear();
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        problems_.push_back({dY.slice(off[e], off[e + 1]), X.slice(off[e], off[e + 1]), dW.select(e)});
    ops::gemm_grouped(problems_, ops::Trans::T, ops::Trans::N, 1.0f, 1.0f);
  };
  // y_e = act_e · W_d[e]ᵀ
  expert_linear_backward(dy, wd, act, s.dact, g.w_d);
  // act = SiLU(g) ⊙ v
  ops::swiglu_backward(s.dact.slice(0, M), t.gu.slice(0, M), s.dgu.slice(0, M));
  if (b16) ops::cast_to_bf16(s.dgu.slice(0, M), s.dgu16.slice(0, M));
  const Tensor& dgu = b16 ? s.dgu16 : s.dgu;
  // gu_e = xp_e · W_gu[e]ᵀ
  expert_linear_backward(dgu, wgu, xp, s.dxp, g.w_gu);
}

namespace {

// Times one GEMM call into `ns` (summed over the threads).
template <class F>
void timed_gemm(std::atomic<int64_t>& ns, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// The fused backward's four products of one expert, each on the calling thread through the path a
// side-by-side grouped call gives it, over rows [r0, r1) of the expert (the whole expert, or a row
// piece for the two that go row by row), with their time summed into `ns`.
struct ExpertBackwardProducts {
  const LayerActs& t;
  ScratchActs& s;
  const LayerParams& p;
  LayerParams& g;
  std::atomic<int64_t>& ns;

  void run(const Tensor& a, ops::Trans ta, const Tensor& b, const Tensor& c, float beta) const {
    ops::GemmProblem one[1] = {{a, b, c}};
    timed_gemm(ns, [&] { ops::cpu::gemm_grouped_on_this_thread(one, ta, ops::Trans::N, 1.0f, beta); });
  }
  // y_e = act_e · W_d[e]ᵀ:  dact = dy·W_d
  void dact(int64_t e, int64_t r0, int64_t r1) const {
    run(s.dy.slice(r0, r1), ops::Trans::N, p.w_d.select(e), s.dact.slice(r0, r1), 0.0f);
  }
  // act = SiLU(g) ⊙ v, then gu_e = xp_e · W_gu[e]ᵀ:  SwiGLU's backward into dgu, dxp = dgu·W_gu
  void dxp(int64_t e, int64_t r0, int64_t r1) const {
    ops::swiglu_backward(s.dact.slice(r0, r1), t.gu.slice(r0, r1), s.dgu.slice(r0, r1));
    run(s.dgu.slice(r0, r1), ops::Trans::N, p.w_gu.select(e), s.dxp.slice(r0, r1), 0.0f);
  }
  // dW_d += dyᵀ·act and dW_gu += dguᵀ·xp (all of the expert's rows: r0, r1 its offsets)
  void dw_d(int64_t e, int64_t r0, int64_t r1) const {
    run(s.dy.slice(r0, r1), ops::Trans::T, t.act.slice(r0, r1), g.w_d.select(e), 1.0f);
  }
  void dw_gu(int64_t e, int64_t r0, int64_t r1) const {
    run(s.dgu.slice(r0, r1), ops::Trans::T, t.xp.slice(r0, r1), g.w_gu.select(e), 1.0f);
  }
};

}  // namespace

void ZayaModel::set_fused_experts(bool on) { fused_experts_ = on; }

// Layer l's experts with tokens as the grouped gate_up call would plan them side by side
// (ops::gemm_grouped_side_by_side_plan); expert_order_ then holds them largest first. What runs:
//  * balanced plan (the grouped call's own 1.2× rule): the fused way, one task per expert;
//  * uneven plan: the experts cut into row pieces (cut_expert_rows; plan_fused_forward,
//    expert_backward_pieces), since the grouped way would split every expert GEMM among all the
//    threads and run the router's backward after them. Not on the AVX2-only paths, where the
//    backward keeps one task per expert when there are no more experts than threads (`few`: the
//    thread with the largest expert sets the region's length while the others take the side
//    tasks) and the rest goes grouped;
//  * not possible (large weights, bf16, one thread, one expert with tokens, fused way off): grouped.
// The backward plans again from the same token counts (less than keeping a plan per layer). Every
// way gives the same bits. Measured on 8 and 16 threads: docs/results/model-cpu-sessions.md, session 24.
ops::cpu::SideBySidePlan ZayaModel::plan_fused_experts(int l) {
  if (!fused_experts_ || gemm_dtype_ != DType::f32) return {};
  const LayerActs& t = acts_[l];
  const int32_t* off = t.offsets.data<int32_t>();
  problems_.clear();
  expert_ids_.clear();
  for (int64_t e = 0; e < cfg_.num_experts; ++e)
    if (off[e + 1] > off[e]) {
      problems_.push_back(
          {t.xp.slice(off[e], off[e + 1]), lp_[l].w_gu.select(e), t.gu.slice(off[e], off[e + 1])});
      expert_ids_.push_back(e);
    }
  const ops::cpu::SideBySidePlan plan =
      ops::cpu::gemm_grouped_side_by_side_plan(problems_, ops::Trans::N, ops::Trans::T, expert_order_);
  for (size_t& i : expert_order_) i = static_cast<size_t>(expert_ids_[i]);
  return plan;
}

// Row pieces of layer l's experts in expert_order_ into `pieces`, largest first: pieces of at least
// kMinPieceRows rows, aiming at two per thread, so the threads finish within about half a piece
// of each other. A piece's x·Wᵀ and dy·W products (tokens in M) give the whole expert's bits for
// its rows: the same runtime-M kernel as the grouped calls' row halves
// (Gemm.GroupedExpertsSideBySideMatchReferenceAndOneThreadBitwise). Not on the AVX2-only paths,
// where a product's bits depend on its row count (pieces fixed by its shape: ops/gemm.h).
void ZayaModel::cut_expert_rows(int l, std::vector<ExpertRows>& pieces) const {
  constexpr int64_t kMinPieceRows = 64;
  const int32_t* off = acts_[l].offsets.data<int32_t>();
  const int64_t threads = num_threads();
  const int64_t target = std::max<int64_t>(kMinPieceRows, (acts_[l].M + 2 * threads - 1) / (2 * threads));
  pieces.clear();
  for (size_t e : expert_order_) {
    const int64_t r0 = off[e], m = off[e + 1] - r0;
    // n pieces of at least kMinPieceRows rows (the last m − step·(n−1) ≥ m/n ≥ kMinPieceRows).
    const int64_t n =
        std::clamp<int64_t>((m + target / 2) / target, 1, std::max<int64_t>(1, m / kMinPieceRows));
    const int64_t step = ops::cpu::row_piece_step(m, n);
    for (int64_t k = 0; k < n; ++k)
      pieces.push_back({static_cast<int64_t>(e), r0 + k * step, k + 1 < n ? r0 + (k + 1) * step : r0 + m});
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const ExpertRows& a, const ExpertRows& b) { return a.r1 - a.r0 > b.r1 - b.r0; });
}

// The forward's tasks: whole experts when their plan is balanced; otherwise the experts' row
// pieces (cut_expert_rows), or the grouped way on the AVX2-only paths. On 16 threads the demo's
// forward experts took 15.2 ms per step as whole experts and 10.1 grouped; in pieces, 7.9 ms
// (docs/results/model-cpu-sessions.md, session 24).
bool ZayaModel::plan_fused_forward(int l) {
  const int32_t* off = acts_[l].offsets.data<int32_t>();
  forward_pieces_.clear();
  const ops::cpu::SideBySidePlan plan = plan_fused_experts(l);
  if (plan.balanced) {
    for (size_t e : expert_order_) forward_pieces_.push_back({static_cast<int64_t>(e), off[e], off[e + 1]});
    return true;
  }
  if (!plan.possible || ops::cpu::gemm_avx2_paths()) return false;
  cut_expert_rows(l, forward_pieces_);
  return true;
}

// Forward of layer l's experts, one task per expert or row piece of one (plan_fused_forward):
// gather its rows, gate_up, SwiGLU, down. Returns false (nothing done) when the grouped way should
// run instead.
bool ZayaModel::expert_forward_fused(int l) {
  if (!plan_fused_forward(l)) return false;
  LayerActs& t = acts_[l];
  const LayerParams& p = lp_[l];
  const int threads = num_threads();
  const int64_t N = B_ * T_, H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
  std::atomic<int64_t> ns{0};
  take_in_turn(forward_pieces_.size(), threads, [&](size_t j) {
    const auto [e, r0, r1] = forward_pieces_[j];
    ops::moe_gather_rows(t.xp, t.w, t.src, r0, r1, N, H);
    ops::GemmProblem one[1] = {{t.xp.slice(r0, r1), p.w_gu.select(e), t.gu.slice(r0, r1)}};
    timed_gemm(ns, [&] { ops::cpu::gemm_grouped_on_this_thread(one, ops::Trans::N, ops::Trans::T); });
    ops::swiglu_forward(t.gu.slice(r0, r1), t.act.slice(r0, r1));
    one[0] = {t.act.slice(r0, r1), p.w_d.select(e), t.y.slice(r0, r1)};
    timed_gemm(ns, [&] { ops::cpu::gemm_grouped_on_this_thread(one, ops::Trans::N, ops::Trans::T); });
  });
  // The GEMMs' share of the region's wall time: their thread time over the threads.
  if (fused_forward_label_.empty())  // built once: a step allocates nothing
    fused_forward_label_ = "fused experts forward f32 (NT ?x" + std::to_string(2 * I) + "x" +
                           std::to_string(H) + ", NT ?x" + std::to_string(H) + "x" + std::to_string(I) + ")";
  ops::cpu::gemm_time_record(fused_forward_label_, 1e-9 * static_cast<double>(ns.load()) / threads,
                        2.0 * static_cast<double>(t.M) * (2 * I * H + H * I));
  return true;
}

// Backward of layer l's experts, one task per expert: from s.dy (its rows), dact = dy·W_d and
// dW_d += dyᵀ·act; SwiGLU's backward into dgu; dxp = dgu·W_gu and dW_gu += dguᵀ·xp. The scatter
// of dxp back to token order stays with the caller. After the experts, the same threads take the
// side tasks that do not depend on them (this layer's router backward and the pending weight
// gradients, largest first: plan_backward_side_tasks), so whichever thread finishes its experts
// first fills the time it would have waited. When the experts' plan is uneven (and not on the
// AVX2-only paths), the tasks are finer (expert_backward_pieces). Returns false (nothing done)
// when the grouped way should run.
bool ZayaModel::expert_backward_fused(int l) {
  const ops::cpu::SideBySidePlan plan = plan_fused_experts(l);
  if (!plan.possible) return false;
  if (!plan.balanced) {
    if (!ops::cpu::gemm_avx2_paths()) {
      expert_backward_pieces(l);
      return true;
    }
    if (!plan.few) return false;
  }
  const int threads = num_threads();
  const int32_t* off = acts_[l].offsets.data<int32_t>();
  std::atomic<int64_t> ns{0};
  const ExpertBackwardProducts x{acts_[l], *scratch_, lp_[l], lg_[l], ns};
  plan_backward_side_tasks();
  const size_t experts = expert_order_.size(), side_tasks = side_order_.size();
  take_in_turn(experts + side_tasks, threads, [&](size_t j) {
    if (j >= experts) {
      run_backward_side_task(l, j - experts);
      return;
    }
    const int64_t e = static_cast<int64_t>(expert_order_[j]), r0 = off[e], r1 = off[e + 1];
    x.dact(e, r0, r1);
    x.dw_d(e, r0, r1);
    x.dxp(e, r0, r1);
    x.dw_gu(e, r0, r1);
  });
  record_backward_gemm_time(l, ns.load());
  return true;
}

// The uneven plan's backward, in finer tasks than one per expert. An expert's weight gradients sum
// all of its rows, so they stay whole, one task each; what runs row by row is cut
// (cut_expert_rows):
//   piece (rows of expert e):  dact = dy·W_d, SwiGLU's backward into dgu, dxp = dgu·W_gu
//   dW_d(e) += dyᵀ·act          (reads only the forward's act and dy: a task of its own)
//   dW_gu(e) += dguᵀ·xp         (needs all of e's dgu: run by the thread that finishes e's last
//                                piece, while that dgu is still in its caches)
// then the side tasks. The threads take pieces largest first, then the dW_d tasks, then the side
// tasks. Every product is the whole-task way's (the same one-thread paths, the pieces' rows
// bitwise the whole expert's), so the bits are too. On 16 threads the whole tasks left the
// region as long as the largest expert's (docs/results/model-cpu-sessions.md, session 24).
void ZayaModel::expert_backward_pieces(int l) {
  const int threads = num_threads();
  const int32_t* off = acts_[l].offsets.data<int32_t>();
  cut_expert_rows(l, backward_pieces_);
  if (!pieces_left_)
    pieces_left_ = std::make_unique<std::atomic<int32_t>[]>(static_cast<size_t>(cfg_.num_experts));
  for (int64_t e = 0; e < cfg_.num_experts; ++e) pieces_left_[static_cast<size_t>(e)].store(0);
  for (const ExpertRows& pc : backward_pieces_) pieces_left_[static_cast<size_t>(pc.e)].fetch_add(1);
  std::atomic<int64_t> ns{0};
  const ExpertBackwardProducts x{acts_[l], *scratch_, lp_[l], lg_[l], ns};
  plan_backward_side_tasks();
  const size_t pieces = backward_pieces_.size(), experts = expert_order_.size(),
               side_tasks = side_order_.size();
  take_in_turn(pieces + experts + side_tasks, threads, [&](size_t j) {
    if (j < pieces) {
      const auto [e, r0, r1] = backward_pieces_[j];
      x.dact(e, r0, r1);
      x.dxp(e, r0, r1);
      if (pieces_left_[static_cast<size_t>(e)].fetch_sub(1, std::memory_order_acq_rel) == 1)
        x.dw_gu(e, off[e], off[e + 1]);
      return;
    }
    if (j < pieces + experts) {
      const int64_t e = static_cast<int64_t>(expert_order_[j - pieces]);
      x.dw_d(e, off[e], off[e + 1]);
      return;
    }
    run_backward_side_task(l, j - pieces - experts);
  });
  record_backward_gemm_time(l, ns.load());
}

// The fused backward's GEMMs' share of the region's wall time: their thread time over the threads.
void ZayaModel::record_backward_gemm_time(int l, int64_t ns) {
  const int64_t H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
  if (fused_backward_label_.empty())
    fused_backward_label_ = "fused experts backward f32 (NN, TN of ?x" + std::to_string(H) + "x" +
                            std::to_string(I) + " and ?x" + std::to_string(I) + "x" + std::to_string(H) +
                            " shapes)";
  ops::cpu::gemm_time_record(fused_backward_label_, 1e-9 * static_cast<double>(ns) / num_threads(),
                        4.0 * static_cast<double>(acts_[l].M) * (2 * I * H + H * I));
}

}  // namespace zaya::model
