// The experts of one layer on the CPU, forward and backward (ops/experts.h). Two ways to run them,
// with the same bits:
//  * Grouped: each step is one pass over every expert (a grouped GEMM call, then SwiGLU over all M
//    rows, then the next grouped call).
//  * Fused: one task per expert runs all of that expert's steps, taken by the threads as they free
//    up, so the expert's intermediates ([g; v]: 1 MiB for the demo's ~256 rows) are still in the
//    core's L2 when the next step reads them, and a layer has one parallel region instead of three
//    to five. Each GEMM runs on one thread through the path a side-by-side grouped call gives it
//    (gemm_grouped_on_this_thread), so the results are the grouped way's. Used in f32 for experts
//    with small weights (those the grouped calls run side by side too) when the plan keeps the
//    threads even, in row pieces when it does not; the grouped way otherwise (bf16 weights or saved
//    activations, ZAYA1's large experts, one thread).
#include "zaya/ops/cpu/experts_cpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "zaya/core/parallel.h"
#include "zaya/core/threads.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/moe.h"

namespace zaya::ops::cpu {
namespace {

bool g_fused = true;

struct ExpertRows {
  int64_t e, r0, r1;  // expert e's rows [r0, r1) of the grouped order
};

// Plans reused from call to call, so that a training step allocates nothing after its first.
// Thread-local: each calling thread (one per model) has its own. Code inside a parallel region
// must use the calling thread's (bound to a reference before the region), not its own.
struct Workspace {
  std::vector<GemmProblem> problems;
  std::vector<int64_t> expert_ids;   // experts with tokens
  std::vector<size_t> expert_order;  // the order the threads take them in (expert indices)
  std::vector<ExpertRows> pieces;    // the fused forward's or the uneven backward's row tasks
  std::unique_ptr<std::atomic<int32_t>[]> pieces_left;  // per expert: its row tasks not yet done
  int64_t pieces_left_size = 0;
  std::vector<SideTask> side;  // the side tasks, largest first
  std::string forward_label, backward_label;  // GEMM-time rows of the fused ways
};
thread_local Workspace t_ws;

// Times one GEMM call into `ns` (summed over the threads).
template <class F>
void timed_gemm(std::atomic<int64_t>& ns, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// The grouped way, forward. With bf16 weights the GEMM inputs are bf16 copies (xp16, act16); gu16
// and y16, where defined, receive bf16 copies of gu and y as the GEMMs make them.
void grouped_forward(const Tensor& x, const Tensor& src, const int32_t* off, int64_t E, int64_t M,
                     const ExpertWeights& w, const ExpertActs& a) {
  const bool b16 = w.gate_up.dtype() == DType::bf16;
  const int64_t N = x.size(0), H = x.size(1);
  ops::moe_gather(a.xp, x, src, M, N, H);
  if (b16) ops::cast_to_bf16(a.xp16.slice(0, M), a.xp.slice(0, M));
  const Tensor& xp = b16 ? a.xp16 : a.xp;
  std::vector<GemmProblem>& problems = t_ws.problems;
  problems.clear();
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e])
      problems.push_back({xp.slice(off[e], off[e + 1]), w.gate_up.select(e), a.gu.slice(off[e], off[e + 1])});
  ops::gemm_grouped(problems, Trans::N, Trans::T);
  if (a.gu16.defined()) ops::cast_to_bf16(a.gu16.slice(0, M), a.gu.slice(0, M));
  ops::swiglu_forward(a.act.slice(0, M), a.gu.slice(0, M));
  if (b16) ops::cast_to_bf16(a.act16.slice(0, M), a.act.slice(0, M));
  const Tensor& act = b16 ? a.act16 : a.act;
  problems.clear();
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e])
      problems.push_back({act.slice(off[e], off[e + 1]), w.down.select(e), a.y.slice(off[e], off[e + 1])});
  ops::gemm_grouped(problems, Trans::N, Trans::T);
  if (a.y16.defined()) ops::cast_to_bf16(a.y16.slice(0, M), a.y.slice(0, M));
}

// The grouped way, backward: dxp written, dW_d and dW_gu accumulated.
void grouped_backward(const Tensor& dy_f32, const Tensor& dxp, const int32_t* off, int64_t E, int64_t M,
                      const ExpertWeights& w, const ExpertWeights& g, const ExpertActs& a, const ExpertScratch& s) {
  const bool b16 = w.gate_up.dtype() == DType::bf16;
  if (b16) ops::cast_to_bf16(s.dy16.slice(0, M), dy_f32.slice(0, M));
  const Tensor& dy = b16 ? s.dy16 : dy_f32;
  const Tensor& act = b16 ? a.act16 : a.act;
  const Tensor& xp = b16 ? a.xp16 : a.xp;
  std::vector<GemmProblem>& problems = t_ws.problems;
  // Backward of every expert's linear y_e = x_e · W[e]ᵀ (experts with no tokens skipped):
  // dx_e = dy_e · W[e] (written), dW[e] += dy_eᵀ · x_e.
  auto expert_linear_backward = [&](const Tensor& dY, const Tensor& W, const Tensor& X, const Tensor& dX,
                                    const Tensor& dW) {
    problems.clear();
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        problems.push_back({dY.slice(off[e], off[e + 1]), W.select(e), dX.slice(off[e], off[e + 1])});
    ops::gemm_grouped(problems, Trans::N, Trans::N);
    problems.clear();
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        problems.push_back({dY.slice(off[e], off[e + 1]), X.slice(off[e], off[e + 1]), dW.select(e)});
    ops::gemm_grouped(problems, Trans::T, Trans::N, 1.0f, 1.0f);
  };
  // y_e = act_e · W_d[e]ᵀ
  expert_linear_backward(dy, w.down, act, s.dact, g.down);
  // act = SiLU(g) ⊙ v, from the saved bf16 copy of gu where there is one
  ops::swiglu_backward(s.dgu.slice(0, M), s.dact.slice(0, M), (a.gu16.defined() ? a.gu16 : a.gu).slice(0, M));
  if (b16) ops::cast_to_bf16(s.dgu16.slice(0, M), s.dgu.slice(0, M));
  const Tensor& dgu = b16 ? s.dgu16 : s.dgu;
  // gu_e = xp_e · W_gu[e]ᵀ
  expert_linear_backward(dgu, w.gate_up, xp, dxp, g.gate_up);
}

// The fused backward's four products of one expert, each on the calling thread through the path a
// side-by-side grouped call gives it, over rows [r0, r1) of the expert (the whole expert, or a row
// piece for the two that go row by row), with their time summed into `ns`.
struct ExpertBackwardProducts {
  const Tensor& dy;
  const Tensor& dxp;
  const ExpertWeights& w;
  const ExpertWeights& g;
  const ExpertActs& a;
  const ExpertScratch& s;
  std::atomic<int64_t>& ns;

  void run(const Tensor& x, Trans ta, const Tensor& b, const Tensor& c, float beta) const {
    GemmProblem one[1] = {{x, b, c}};
    timed_gemm(ns, [&] { gemm_grouped_on_this_thread(one, ta, Trans::N, 1.0f, beta); });
  }
  // y_e = act_e · W_d[e]ᵀ:  dact = dy·W_d
  void dact(int64_t e, int64_t r0, int64_t r1) const {
    run(dy.slice(r0, r1), Trans::N, w.down.select(e), s.dact.slice(r0, r1), 0.0f);
  }
  // act = SiLU(g) ⊙ v, then gu_e = xp_e · W_gu[e]ᵀ:  SwiGLU's backward into dgu, dxp = dgu·W_gu
  void dx(int64_t e, int64_t r0, int64_t r1) const {
    ops::swiglu_backward(s.dgu.slice(r0, r1), s.dact.slice(r0, r1), a.gu.slice(r0, r1));
    run(s.dgu.slice(r0, r1), Trans::N, w.gate_up.select(e), dxp.slice(r0, r1), 0.0f);
  }
  // dW_d += dyᵀ·act and dW_gu += dguᵀ·xp (all of the expert's rows: r0, r1 its offsets)
  void dw_d(int64_t e, int64_t r0, int64_t r1) const {
    run(dy.slice(r0, r1), Trans::T, a.act.slice(r0, r1), g.down.select(e), 1.0f);
  }
  void dw_gu(int64_t e, int64_t r0, int64_t r1) const {
    run(s.dgu.slice(r0, r1), Trans::T, a.xp.slice(r0, r1), g.gate_up.select(e), 1.0f);
  }
};

// The experts with tokens as the grouped gate_up call would plan them side by side
// (gemm_grouped_side_by_side_plan); t_ws.expert_order then holds them largest first. What runs:
//  * balanced plan (the grouped call's own 1.2× rule): the fused way, one task per expert;
//  * uneven plan: the experts cut into row pieces (cut_expert_rows), since the grouped way would
//    split every expert GEMM among all the threads. Not on the AVX2-only paths, where the
//    backward keeps one task per expert when there are no more experts than threads (`few`: the
//    thread with the largest expert sets the region's length while the others take the side
//    tasks) and the rest goes grouped;
//  * not possible (large weights, bf16 weights or saved activations, one thread, one expert with
//    tokens, fused way off): grouped.
// The backward plans again from the same token counts (cheaper than keeping a plan per layer).
// Every way gives the same bits. docs/results/model-cpu.md has the measurements on 8 and 16 threads.
SideBySidePlan plan_fused(const int32_t* off, int64_t E, const ExpertWeights& w, const ExpertActs& a) {
  if (!g_fused || w.gate_up.dtype() != DType::f32 || a.gu16.defined() || a.y16.defined()) return {};
  std::vector<GemmProblem>& problems = t_ws.problems;
  problems.clear();
  t_ws.expert_ids.clear();
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) {
      problems.push_back({a.xp.slice(off[e], off[e + 1]), w.gate_up.select(e), a.gu.slice(off[e], off[e + 1])});
      t_ws.expert_ids.push_back(e);
    }
  const SideBySidePlan plan = gemm_grouped_side_by_side_plan(problems, Trans::N, Trans::T, t_ws.expert_order);
  for (size_t& i : t_ws.expert_order) i = static_cast<size_t>(t_ws.expert_ids[i]);
  return plan;
}

// Row pieces of the experts in t_ws.expert_order into `pieces`, largest first: pieces of at least
// kMinPieceRows rows, aiming at two per thread, so the threads finish within about half a piece of
// each other. A piece's x·Wᵀ and dy·W products (tokens in M) give the whole expert's bits for its
// rows: the same runtime-M kernel as the grouped calls' row halves
// (Gemm.GroupedExpertsSideBySideMatchReferenceAndOneThreadBitwise). Not on the AVX2-only paths,
// where a product's bits depend on its row count (pieces fixed by its shape: ops/cpu/gemm_cpu.h).
void cut_expert_rows(const int32_t* off, int64_t M, std::vector<ExpertRows>& pieces) {
  constexpr int64_t kMinPieceRows = 64;
  const int64_t threads = num_threads();
  const int64_t target = std::max<int64_t>(kMinPieceRows, (M + 2 * threads - 1) / (2 * threads));
  pieces.clear();
  for (size_t e : t_ws.expert_order) {
    const int64_t r0 = off[e], m = off[e + 1] - r0;
    // n pieces of at least kMinPieceRows rows (the last m − step·(n−1) ≥ m/n ≥ kMinPieceRows).
    const int64_t n =
        std::clamp<int64_t>((m + target / 2) / target, 1, std::max<int64_t>(1, m / kMinPieceRows));
    const int64_t step = row_piece_step(m, n);
    for (int64_t k = 0; k < n; ++k)
      pieces.push_back({static_cast<int64_t>(e), r0 + k * step, k + 1 < n ? r0 + (k + 1) * step : r0 + m});
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const ExpertRows& a, const ExpertRows& b) { return a.r1 - a.r0 > b.r1 - b.r0; });
}

// The forward's tasks: whole experts when their plan is balanced; otherwise the experts' row
// pieces (cut_expert_rows), or the grouped way (false) on the AVX2-only paths. On 16 threads the
// demo's forward experts took 15.2 ms per step as whole experts, 10.1 grouped and 7.9 in pieces.
bool plan_fused_forward(const int32_t* off, int64_t E, int64_t M, const ExpertWeights& w, const ExpertActs& a) {
  std::vector<ExpertRows>& pieces = t_ws.pieces;
  pieces.clear();
  const SideBySidePlan plan = plan_fused(off, E, w, a);
  if (plan.balanced) {
    for (size_t e : t_ws.expert_order) pieces.push_back({static_cast<int64_t>(e), off[e], off[e + 1]});
    return true;
  }
  if (!plan.possible || gemm_avx2_paths()) return false;
  cut_expert_rows(off, M, pieces);
  return true;
}

// Forward, one task per expert or row piece of one: gather its rows, gate_up, SwiGLU, down.
void fused_forward(const Tensor& x, const Tensor& src, int64_t M, const ExpertWeights& w, const ExpertActs& a) {
  Workspace& ws = t_ws;  // the calling thread's
  const int threads = num_threads();
  const int64_t N = x.size(0), H = x.size(1), I = a.act.size(1);
  std::atomic<int64_t> ns{0};
  take_in_turn(ws.pieces.size(), threads, [&](size_t j) {
    const auto [e, r0, r1] = ws.pieces[j];
    ops::moe_gather_rows(a.xp, x, src, r0, r1, N, H);
    GemmProblem one[1] = {{a.xp.slice(r0, r1), w.gate_up.select(e), a.gu.slice(r0, r1)}};
    timed_gemm(ns, [&] { gemm_grouped_on_this_thread(one, Trans::N, Trans::T); });
    ops::swiglu_forward(a.act.slice(r0, r1), a.gu.slice(r0, r1));
    one[0] = {a.act.slice(r0, r1), w.down.select(e), a.y.slice(r0, r1)};
    timed_gemm(ns, [&] { gemm_grouped_on_this_thread(one, Trans::N, Trans::T); });
  });
  // The GEMMs' share of the region's wall time: their thread time over the threads.
  if (ws.forward_label.empty())  // built once: a step allocates nothing
    ws.forward_label = "fused experts forward f32 (NT ?x" + std::to_string(2 * I) + "x" + std::to_string(H) +
                         ", NT ?x" + std::to_string(H) + "x" + std::to_string(I) + ")";
  gemm_time_record(ws.forward_label, 1e-9 * static_cast<double>(ns.load()) / threads,
                   2.0 * static_cast<double>(M) * (2 * I * H + H * I));
}

// The fused backward's GEMMs' share of the region's wall time: their thread time over the threads.
void record_backward_gemm_time(int64_t M, int64_t H, int64_t I, int64_t ns) {
  if (t_ws.backward_label.empty())
    t_ws.backward_label = "fused experts backward f32 (NN, TN of ?x" + std::to_string(H) + "x" +
                          std::to_string(I) + " and ?x" + std::to_string(I) + "x" + std::to_string(H) + " shapes)";
  gemm_time_record(t_ws.backward_label, 1e-9 * static_cast<double>(ns) / num_threads(),
                   4.0 * static_cast<double>(M) * (2 * I * H + H * I));
}

// The side tasks in the order the threads take them: largest first (stable), so the region ends
// on small ones. Taken in the caller's order instead, with a layer's 0.4 GFLOP dW_qkv among the
// last, the demo's threads finished a layer's region 1.2 ms apart; largest first, 0.8–1.0 ms.
void order_side_tasks(std::span<SideTask> side) {
  std::vector<SideTask>& s = t_ws.side;
  s.assign(side.begin(), side.end());
  // A handful of tasks: insertion sort, stable, allocation-free after the first call.
  for (size_t i = 1; i < s.size(); ++i)
    for (size_t j = i; j > 0 && s[j].cost > s[j - 1].cost; --j) std::swap(s[j], s[j - 1]);
}

void run_side(const Workspace& ws, size_t j) { ws.side[j].run(ws.side[j].context, ws.side[j].arg); }

// Backward, one task per expert: from dy (its rows), dact = dy·W_d and dW_d += dyᵀ·act; SwiGLU's
// backward into dgu; dxp = dgu·W_gu and dW_gu += dguᵀ·xp. After the experts, the same threads take
// the side tasks, so whichever thread finishes its experts first fills the time it would have
// waited.
void fused_backward_whole(const ExpertBackwardProducts& x, const int32_t* off) {
  Workspace& ws = t_ws;  // the calling thread's
  const size_t experts = ws.expert_order.size(), side_tasks = ws.side.size();
  take_in_turn(experts + side_tasks, num_threads(), [&](size_t j) {
    if (j >= experts) {
      run_side(ws, j - experts);
      return;
    }
    const int64_t e = static_cast<int64_t>(ws.expert_order[j]), r0 = off[e], r1 = off[e + 1];
    x.dact(e, r0, r1);
    x.dw_d(e, r0, r1);
    x.dx(e, r0, r1);
    x.dw_gu(e, r0, r1);
  });
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
// bitwise the whole expert's), so the bits are too. Whole tasks leave the region as long as the
// largest expert's, which on 16 threads is most of it.
void fused_backward_pieces(const ExpertBackwardProducts& x, const int32_t* off, int64_t E, int64_t M) {
  Workspace& ws = t_ws;  // the calling thread's
  cut_expert_rows(off, M, ws.pieces);
  if (ws.pieces_left_size < E) {
    ws.pieces_left = std::make_unique<std::atomic<int32_t>[]>(static_cast<size_t>(E));
    ws.pieces_left_size = E;
  }
  std::atomic<int32_t>* left = ws.pieces_left.get();
  for (int64_t e = 0; e < E; ++e) left[e].store(0);
  for (const ExpertRows& pc : ws.pieces) left[pc.e].fetch_add(1);
  const size_t pieces = ws.pieces.size(), experts = ws.expert_order.size(), side_tasks = ws.side.size();
  take_in_turn(pieces + experts + side_tasks, num_threads(), [&](size_t j) {
    if (j < pieces) {
      const auto [e, r0, r1] = ws.pieces[j];
      x.dact(e, r0, r1);
      x.dx(e, r0, r1);
      if (left[e].fetch_sub(1, std::memory_order_acq_rel) == 1) x.dw_gu(e, off[e], off[e + 1]);
      return;
    }
    if (j < pieces + experts) {
      const int64_t e = static_cast<int64_t>(ws.expert_order[j - pieces]);
      x.dw_d(e, off[e], off[e + 1]);
      return;
    }
    run_side(ws, j - pieces - experts);
  });
}

}  // namespace

void set_fused_experts(bool on) { g_fused = on; }
bool fused_experts() { return g_fused; }

void experts_forward(const ExpertActs& a, const Tensor& x, const Tensor& src, const Tensor& offsets,
                     const ExpertWeights& w, int64_t M) {
  if (M == 0) return;
  const int32_t* off = offsets.data<int32_t>();
  const int64_t E = offsets.numel() - 1;
  if (plan_fused_forward(off, E, M, w, a))
    fused_forward(x, src, M, w, a);
  else
    grouped_forward(x, src, off, E, M, w, a);
}

bool experts_backward(const Tensor& dxp, const ExpertWeights& grads, const Tensor& dy, const Tensor& offsets,
                      const ExpertWeights& w, const ExpertActs& a, const ExpertScratch& scratch,
                      int64_t M, std::span<SideTask> side) {
  if (M == 0) return false;
  const int32_t* off = offsets.data<int32_t>();
  const int64_t E = offsets.numel() - 1, H = a.xp.size(1), I = a.act.size(1);
  // Whole experts on a balanced plan; row pieces on an uneven one, except on the AVX2-only paths,
  // which keep whole experts when there are no more of them than threads and go grouped otherwise.
  const SideBySidePlan plan = plan_fused(off, E, w, a);
  enum class Way { grouped, whole, pieces } way = Way::grouped;
  if (plan.balanced)
    way = Way::whole;
  else if (plan.possible)
    way = !gemm_avx2_paths() ? Way::pieces : plan.few ? Way::whole : Way::grouped;
  if (way == Way::grouped) {
    grouped_backward(dy, dxp, off, E, M, w, grads, a, scratch);
    return false;
  }
  std::atomic<int64_t> ns{0};
  const ExpertBackwardProducts x{dy, dxp, w, grads, a, scratch, ns};
  order_side_tasks(side);
  if (way == Way::whole)
    fused_backward_whole(x, off);
  else
    fused_backward_pieces(x, off, E, M);
  record_backward_gemm_time(M, H, I, ns.load());
  return true;
}

}  // namespace zaya::ops::cpu
