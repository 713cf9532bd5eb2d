// One ZAYA1 decoder layer, forward and backward (DESIGN.md, "Layer", "CCA", "Router", "Experts"):
//   u = RMSNorm_in(x);  a = o_proj(attention(CCA(u)));  x_mid = RS_attn(a, x);
//   w = RMSNorm_post(x_mid);  (m, r_l) = MoE(w, r_{l−1});  x_out = RS_mlp(m, x_mid).
// The backward walks the same steps in reverse; each step's comment gives the forward it undoes.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "zaya/core/parallel.h"
#include "zaya/core/threads.h"
#include "zaya/model/model_internal.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/moe.h"
#include "zaya/ops/rope.h"

namespace zaya::model {

namespace {

// The router input's gradient at layer l: dr += carried (what reached r_l through layer l+1's
// EDA); then, where layer l has EDA (r_l = h_l + s ⊙ r_{l−1}; r_prev non-null), ds += Σ_rows
// dr ⊙ r_{l−1} and carried = dr ⊙ s for layer l−1. One pass over the rows: [N, R] is read row by
// row (a column-by-column walk read each cache line R/16 times), in fixed 256-row chunks whose
// partial ds are added in chunk order, so ds does not depend on the thread count.
void router_input_backward(const Tensor& dr, const Tensor& carried, const float* r_prev, const float* s, float* ds,
                           int64_t N, int64_t R) {
  constexpr int64_t kRows = 256;
  float* d = dr.data<float>();
  float* c = carried.data<float>();
  const int64_t chunks = (N + kRows - 1) / kRows;
  std::vector<float> part(r_prev ? static_cast<size_t>(chunks * R) : 0, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t i = ch * kRows; i < std::min(N, (ch + 1) * kRows); ++i) {
      float* di = d + i * R;
      float* ci = c + i * R;
      for (int64_t j = 0; j < R; ++j) di[j] += ci[j];
      if (!r_prev) continue;
      const float* ri = r_prev + i * R;
      float* pj = part.data() + ch * R;
      for (int64_t j = 0; j < R; ++j) {
        pj[j] += di[j] * ri[j];
        ci[j] = di[j] * s[j];
      }
    }
  if (r_prev)
    for (int64_t ch = 0; ch < chunks; ++ch)
      for (int64_t j = 0; j < R; ++j) ds[j] += part[ch * R + j];
}

}  // namespace

// Backward scheduling. Two pieces of a layer's backward lie off its critical path: the router's
// backward, which needs only dL/dweight (from the unpermute) and joins the chain where dr·W_down
// adds into dL/dw after the experts; and the weight gradients of the attention's projections
// (dW_o, dW_qkv), which nothing downstream reads. Run in place, each is a chain of small GEMMs and
// passes split across the threads, waiting at every join. So the router's backward, and the
// projections' weight gradients of the layer above (pending_wgrads_: their dy lives in scratch
// that the next layer overwrites only after its experts), run as side tasks of the fused experts
// region (zaya_experts.cc), one task per thread, after the experts: whichever thread finishes its
// experts first takes them. The bits do not change: no GEMM's result depends on which or how many
// threads run it (ops/gemm.cc: an uncut weight gradient runs on one thread everywhere,
// reduction_may_split), and the experts' grouped way runs the same tasks one after another.
// Layer 0's pending gradients run at the end of backward(). Measured in docs/results/model-cpu-sessions.md
// (session 22).
void ZayaModel::router_backward(int l) {
  const int64_t N = B_ * T_, R = cfg_.router_hidden_size, E = cfg_.num_experts;
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  LayerParams& g = lg_[l];
  // Router: weight = p_choice, p = softmax(out_proj(GELU(fc2(GELU(fc1(RMSNorm_R(r))))))).
  ops::moe_route_backward(s.dlogits, s.dweight, t.probs, t.choice, N, E);
  ops::linear_backward(s.dlogits, t.g2, p.outw, s.dg2, g.outw, Tensor{});
  ops::gelu_backward(s.dg2, t.a2, s.dg2);
  ops::linear_backward(s.dg2, t.g1, p.fc2w, s.dg1, g.fc2w, g.fc2b);
  ops::gelu_backward(s.dg1, t.a1, s.dg1);
  ops::linear_backward(s.dg1, t.zr, p.fc1w, s.dzr, g.fc1w, g.fc1b);
  ops::rmsnorm_backward(s.dzr, t.r, p.w_rn, t.rstd_r, s.dr, g.w_rn);
  // + dL/dr_l through layer l+1's EDA; then this layer's EDA (layers ≥ 1): ds_l and the carry.
  router_input_backward(s.dr, s.drc, l > 0 ? acts_[l - 1].r.data<float>() : nullptr,
                        l > 0 ? p.s_eda.data<float>() : nullptr, l > 0 ? g.s_eda.data<float>() : nullptr, N,
                        R);
  // h_l = W_down w + b_down: the parameters' gradients here; dL/dw (+= dr·W_down) waits for the
  // experts' scatter into s.dw (layer_backward).
  ops::linear_backward(s.dr, t.w, p.w_down, Tensor{}, g.w_down, g.b_down);
}

// The side tasks of layer l's fused experts region in the order the threads take them: largest
// first, so the region ends on small ones (side_order_: −1 the router's backward, else an index
// into pending_wgrads_). Costs are FLOPs; the router's counts its GEMMs (dx and dW of W_down,
// fc1, fc2, out_proj). Taken in push order, with dW_qkv's 0.4 GFLOP (one thread: ~3 ms) among the
// last, the threads finished a layer's region 1.2 ms apart; largest first, 0.8–1.0 ms (a temporary
// timer, docs/results/model-cpu/experts-region-gap-2026-11-27-s22.txt).
void ZayaModel::plan_backward_side_tasks() {
  const double N = static_cast<double>(B_ * T_), H = static_cast<double>(cfg_.hidden_size),
               R = static_cast<double>(cfg_.router_hidden_size), E = static_cast<double>(cfg_.num_experts);
  auto cost = [&](int id) {
    if (id < 0) return 4.0 * N * (H * R + 2.0 * R * R + R * (E + 1.0));
    const Tensor& dw = pending_wgrads_[static_cast<size_t>(id)].dw;
    return 2.0 * N * static_cast<double>(dw.numel());
  };
  side_order_.clear();
  side_order_.push_back(-1);
  for (size_t i = 0; i < pending_wgrads_.size(); ++i) side_order_.push_back(static_cast<int>(i));
  // A handful of tasks: insertion sort, stable, allocation-free.
  for (size_t i = 1; i < side_order_.size(); ++i)
    for (size_t j = i; j > 0 && cost(side_order_[j]) > cost(side_order_[j - 1]); --j)
      std::swap(side_order_[j], side_order_[j - 1]);
}

void ZayaModel::run_backward_side_task(int l, size_t j) {
  const int id = side_order_[j];
  if (id < 0) {
    router_backward(l);
    return;
  }
  pending_wgrads_[static_cast<size_t>(id)].run();
}

// The pending weight gradients outside an experts region: side by side, one per thread as the
// threads free up (an uncut Aᵀ·B runs on one thread anyway: ops/gemm.cc, reduction_may_split).
void ZayaModel::run_pending_weight_grads() {
  auto run = [&](size_t j) { pending_wgrads_[j].run(); };
  const int threads = num_threads();
  if (threads > 1 && pending_wgrads_.size() > 1 && !omp_in_parallel())
    take_in_turn(pending_wgrads_.size(), threads, run);
  else
    for (size_t j = 0; j < pending_wgrads_.size(); ++j) run(j);
  pending_wgrads_.clear();
}

void ZayaModel::layer_forward(int l, bool /*need_backward*/) {
  const int64_t N = B_ * T_, H = cfg_.hidden_size, kv = cfg_.kv_dim(), C = cfg_.conv_channels(),
                R = cfg_.router_hidden_size, E = cfg_.num_experts, I = cfg_.moe_intermediate_size;
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const ops::CcaDims dims{nq, nkv, hd};
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  const Tensor& x = s.xs[l];
  SectionClock clock(*this);

  // --- attention -------------------------------------------------------------------------
  clock.part("forward: input norm, qkv projection");
  ops::rmsnorm_forward(x, p.w_in, eps, t.u, t.rstd_in);
  // u·[W_q; W_k; W_vc; W_vd]ᵀ as one product per consumer, each on its rows of the fused weight
  // and into its own contiguous buffer: z = concat(q̃, k̃) (the conv's input, whose rows the mean
  // skip reads too) and [vc | vd] (the value shift's). One product into [N, C + kv] and a copy of
  // its column slices moved 8 MiB per layer for nothing.
  ops::linear_forward(t.u, p.w_qkv.slice(0, C), Tensor{}, t.z);
  ops::linear_forward(t.u, p.w_qkv.slice(C, C + kv), Tensor{}, s.vcd);
  clock.part("forward: CCA (conv, mean skip, value shift, QK norm, RoPE)");
  ops::cca_conv_forward(s.conv, t.z, p.conv, B_, T_, dims);
  // Mean skip → QK norm → RoPE, one token at a time (bitwise the three ops in turn).
  ops::cca_qk_forward(t.qr, t.kr, t.qpre, t.kpre, s.conv, t.z, p.temp, rope_, B_, T_, dims);
  ops::value_shift_forward(t.v, s.vcd, B_, T_, kv / 2);
  clock.part("forward: attention");
  ops::attention_forward(t.att, t.lse, t.qr, t.kr, t.v, B_, T_, nq, nkv, hd);
  clock.part("forward: out projection, residual");
  ops::linear_forward(t.att, p.w_o, Tensor{}, t.o);
  ops::residual_scale_forward(t.o, x, p.rs_attn, t.x_mid);

  // --- router ----------------------------------------------------------------------------
  clock.part("forward: router");
  ops::rmsnorm_forward(t.x_mid, p.w_post, eps, t.w, t.rstd_post);
  ops::linear_forward(t.w, p.w_down, p.b_down, t.r);  // h_l = W_down w + b_down
  if (l > 0) {                                         // EDA: r_l = h_l + s_l ⊙ r_{l−1}
    const float* rp = acts_[l - 1].r.data<float>();
    const float* sc = p.s_eda.data<float>();
    float* r = t.r.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < R; ++j) r[i * R + j] += sc[j] * rp[i * R + j];
  }
  ops::rmsnorm_forward(t.r, p.w_rn, eps, t.zr, t.rstd_r);
  ops::linear_forward(t.zr, p.fc1w, p.fc1b, t.a1);
  ops::gelu_forward(t.a1, t.g1);
  ops::linear_forward(t.g1, p.fc2w, p.fc2b, t.a2);
  ops::gelu_forward(t.a2, t.g2);
  ops::linear_forward(t.g2, p.outw, Tensor{}, s.logits);
  Tensor beta = beta_.select(l);
  ops::moe_route(t.probs, t.choice, t.weight, s.logits, beta, N, E);

  // --- experts: grouped by expert, dropless ----------------------------------------------
  clock.part("forward: experts, residual");
  t.M = ops::moe_plan(t.counts, t.offsets, t.pos, t.src, t.choice, N, E);
  if (t.M > 0 && !expert_forward_fused(l)) {
    ops::moe_gather(t.xp, t.w, t.src, t.M, N, H);
    expert_forward(l);
  }
  ops::moe_unpermute(t.m, t.y, t.weight, t.pos, t.M, N, H);  // m = p_choice · y (0 if skipped)
  ops::residual_scale_forward(t.m, t.x_mid, p.rs_mlp, s.xs[l + 1]);
  (void)I;
}

// In: s.dxa = dL/dx_out, s.drc = dL/dr_l from layer l+1 (0 for the last layer).
// Out: s.dxa = dL/dx_in, s.drc = dL/dr_{l−1}.
void ZayaModel::layer_backward(int l) {
  const int64_t N = B_ * T_, H = cfg_.hidden_size, kv = cfg_.kv_dim(), C = cfg_.conv_channels();
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const ops::CcaDims dims{nq, nkv, hd};
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  LayerParams& g = lg_[l];
  const Tensor& x = s.xs[l];
  SectionClock clock(*this);

  // x_out = RS_mlp(m, x_mid)
  clock.part("backward: experts, residual (+ side tasks)");
  ops::residual_scale_backward(s.dxa, t.m, t.x_mid, p.rs_mlp, s.dm, s.dxmid, g.rs_mlp);
  // m = weight · y[pos]
  ops::moe_unpermute_backward(s.dy, s.dweight, s.dm, t.y, t.weight, t.pos, t.M, N, H);
  // The experts, with the router's backward and the pending weight gradients beside them (see
  // "Backward scheduling" above); the same work one after another when the grouped way runs.
  const bool fused = t.M > 0 && expert_backward_fused(l);
  if (fused) {
    pending_wgrads_.clear();
  } else {
    run_pending_weight_grads();
    if (t.M > 0) expert_backward(l);
  }
  ops::moe_gather_backward(s.dw, s.dxp, t.pos, t.M, N, H);  // xp = w[src]
  clock.part("backward: router");
  if (!fused) router_backward(l);
  // h_l = W_down w + b_down; w also feeds the experts (s.dw from the gather).
  ops::linear_backward(s.dr, t.w, p.w_down, s.dw, Tensor{}, Tensor{}, {}, /*accumulate_dx=*/true);
  // w = RMSNorm_post(x_mid); x_mid also feeds the residual (s.dxmid holds that path's gradient).
  ops::rmsnorm_backward(s.dw, t.x_mid, p.w_post, t.rstd_post, s.dxmid, g.w_post, /*accumulate_dx=*/true);

  // x_mid = RS_attn(o, x)
  clock.part("backward: out projection, residual");
  ops::residual_scale_backward(s.dxmid, t.o, x, p.rs_attn, s.dout_proj, s.dxb, g.rs_attn);
  ops::linear_backward(s.dout_proj, t.att, p.w_o, s.datt, Tensor{}, Tensor{});
  pending_wgrads_.push_back({s.dout_proj, t.att, g.w_o});  // dW_o, pending
  clock.part("backward: attention");
  ops::attention_backward(s.dqr, s.dkr, s.dv, s.datt, t.qr, t.kr, t.v, t.att, t.lse, B_, T_, nq, nkv, hd);
  clock.part("backward: CCA (RoPE, QK norm, mean skip, conv, value shift)");
  // dz: z reaches the loss through the mean skip (cca_qk_backward writes that part) and the conv
  // (added to it).
  ops::cca_qk_backward(s.dconv, s.dz, g.temp, s.dqr, s.dkr, t.qpre, t.kpre, p.temp, rope_, B_, T_, dims);
  ops::cca_conv_backward(s.dz, g.conv, s.dconv, t.z, p.conv, B_, T_, dims, /*accumulate_dz=*/true);
  ops::value_shift_backward(s.dvcd, s.dv, B_, T_, kv / 2);
  clock.part("backward: qkv projection, input norm");
  // The forward's two products on row blocks of W_qkv: their weight gradients are the same row
  // blocks of g.w_qkv, and du sums the two.
  ops::linear_backward(s.dz, t.u, p.w_qkv.slice(0, C), s.du, Tensor{}, Tensor{});
  ops::linear_backward(s.dvcd, t.u, p.w_qkv.slice(C, C + kv), s.du, Tensor{}, Tensor{}, {},
                       /*accumulate_dx=*/true);
  pending_wgrads_.push_back({s.dz, t.u, g.w_qkv.slice(0, C)});  // their weight gradients, pending
  pending_wgrads_.push_back({s.dvcd, t.u, g.w_qkv.slice(C, C + kv)});
  ops::rmsnorm_backward(s.du, x, p.w_in, t.rstd_in, s.dxb, g.w_in, /*accumulate_dx=*/true);  // + the residual path
  std::swap(s.dxa, s.dxb);  // s.dxa = dL/dx_in
}

std::vector<RouterStats> ZayaModel::router_stats() const {
  std::vector<RouterStats> out;
  const int64_t E = cfg_.num_experts, N = B_ * T_;
  for (const LayerActs& t : acts_) {
    RouterStats st;
    const int32_t* c = t.counts.data<int32_t>();
    st.tokens_per_expert.assign(c, c + E);
    st.skipped = N - t.M;
    double h = 0;
    for (int64_t e = 0; e < E; ++e)
      if (c[e] > 0) {
        double f = static_cast<double>(c[e]) / static_cast<double>(t.M);
        h -= f * std::log(f);
      }
    st.load_entropy = E > 1 && t.M > 0 ? h / std::log(static_cast<double>(E)) : 0.0;
    out.push_back(std::move(st));
  }
  return out;
}

Tensor ZayaModel::router_choice(int layer) const {
  ZAYA_CHECK(layer >= 0 && layer < cfg_.num_hidden_layers, "router_choice: layer ", layer, " out of range [0, ",
             cfg_.num_hidden_layers, ")");
  return acts_[layer].choice;
}

}  // namespace zaya::model
