// One ZAYA1 decoder layer, forward and backward (DESIGN.md, "Layer", "CCA", "Router", "Experts"):
//   u = RMSNorm_in(x);  a = o_proj(attention(CCA(u)));  x_mid = RS_attn(a, x);
//   w = RMSNorm_post(x_mid);  (m, r_l) = MoE(w, r_{l−1});  x_out = RS_mlp(m, x_mid).
// A token routed to the skip class gets m = 0, or p_skip·w with ModelConfig::skip_passthrough.
// The backward walks the same steps in reverse; each step's comment gives the forward it undoes.
#include <cmath>
#include <vector>

#include "zaya/model/model_internal.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/gemm_many.h"
#include "zaya/ops/moe.h"
#include "zaya/ops/moe_skip.h"
#include "zaya/ops/rope.h"
#include "zaya/ops/router_state.h"

namespace zaya::model {

// Backward scheduling. Two pieces of a layer's backward lie off its critical path: the router's
// backward, which needs only dL/dweight (from the unpermute) and joins the chain where dr·W_down
// adds into dL/dw after the experts; and the weight gradients of the attention's projections
// (dW_o, dW_qkv), which nothing downstream reads. So the router's backward, and the projections'
// weight gradients of the layer above (pending_wgrads_: their dy lives in scratch that the next
// layer overwrites only after its experts), are handed to the experts' backward as side tasks
// (ops/experts.h) that a backend may run beside the experts; where it does not, they run right
// after. Either way the bits are the same: the tasks touch memory the experts do not, and no GEMM's
// result depends on which or how many threads run it. Layer 0's pending gradients run at the end of
// backward(). A side task's cost is its FLOPs; the router's counts its GEMMs (dx and dW of W_down,
// fc1, fc2, out_proj).
// The bf16 GEMM path (set_gemm_dtype): every dense projection of the layer, forward and both
// backward GEMMs, takes bf16 copies of its weight (dense16_, cast once per forward) and of its
// input activation (cast as the forward makes it, saved for the weight gradient); its output
// gradient is cast into a bf16 workspace by linear_backward. Outputs, biases and bias gradients
// stay f32.
void ZayaModel::cast_dense_weights(int l) {
  const LayerParams& p = lp_[static_cast<size_t>(l)];
  const DenseWeights16& w = dense16_[static_cast<size_t>(l)];
  ops::cast_to_bf16(w.w_qkv, p.w_qkv);
  ops::cast_to_bf16(w.w_o, p.w_o);
  ops::cast_to_bf16(w.w_down, p.w_down);
  ops::cast_to_bf16(w.fc1w, p.fc1w);
  ops::cast_to_bf16(w.fc2w, p.fc2w);
  ops::cast_to_bf16(w.outw, p.outw);
}

ZayaModel::DenseGemms ZayaModel::dense_gemms(int l) const {
  const LayerActs& t = acts_[static_cast<size_t>(l)];
  const LayerParams& p = lp_[static_cast<size_t>(l)];
  if (gemm_dtype_ != DType::bf16)
    return {p.w_qkv, p.w_o, p.w_down, p.fc1w, p.fc2w, p.outw, t.u, t.att, t.w, t.zr, t.g1, t.g2};
  const DenseWeights16& w = dense16_[static_cast<size_t>(l)];
  return {w.w_qkv, w.w_o, w.w_down, w.fc1w, w.fc2w, w.outw, t.u16, t.att16, t.w16, t.zr16, t.g1_16, t.g2_16};
}

void ZayaModel::router_backward(int l) {
  const int64_t N = B_ * T_, E = cfg_.num_experts;
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  LayerParams& g = lg_[l];
  const DenseGemms d = dense_gemms(l);
  // Router: weight = p_choice, p = softmax(out_proj(GELU(fc2(GELU(fc1(RMSNorm_R(r))))))).
  ops::moe_route_backward(s.dlogits, s.dweight, t.probs, t.choice, N, E);
  // Skip passthrough: m[n] = p_skip·w[n] for skipped tokens, so dL/dp_skip = ⟨dm[n], w[n]⟩ enters
  // the same softmax (s.dm is not written again before the next layer's backward).
  if (cfg_.skip_passthrough)
    ops::moe_skip_router_backward(s.dlogits, s.dm, t.w, t.probs, t.choice, N, E, cfg_.hidden_size);
  ops::linear_backward(s.dg2, g.outw, Tensor{}, s.dlogits, d.g2, d.outw, s.dlogits16);
  ops::gelu_backward(s.dg2, s.dg2, t.a2);
  ops::linear_backward(s.dg1, g.fc2w, g.fc2b, s.dg2, d.g1, d.fc2w, s.dg2_16);
  ops::gelu_backward(s.dg1, s.dg1, t.a1);
  ops::linear_backward(s.dzr, g.fc1w, g.fc1b, s.dg1, d.zr, d.fc1w, s.dg1_16);
  ops::rmsnorm_backward(s.dr, g.w_rn, s.dzr, t.r, p.w_rn, t.rstd_r);
  // + dL/dr_l through layer l+1's EDA; then this layer's EDA (layers ≥ 1): ds_l and the carry.
  if (l > 0)
    ops::eda_backward(s.dr, s.drc, g.s_eda, acts_[l - 1].r, p.s_eda);
  else
    ops::eda_backward(s.dr, s.drc, Tensor{}, Tensor{}, Tensor{});
  // h_l = W_down w + b_down: the parameters' gradients here; dL/dw (+= dr·W_down) waits for the
  // experts' scatter into s.dw (layer_backward).
  ops::linear_backward(Tensor{}, g.w_down, g.b_down, s.dr, d.w, d.w_down, s.dr16);
}

void ZayaModel::run_router_backward(void* model, int64_t l) {
  static_cast<ZayaModel*>(model)->router_backward(static_cast<int>(l));
}

void ZayaModel::run_pending_weight_grad(void* model, int64_t j) {
  const ops::GemmProblem& w = static_cast<ZayaModel*>(model)->pending_wgrads_[static_cast<size_t>(j)];
  ops::gemm(w.C, w.A, ops::Trans::T, w.B, ops::Trans::N, 1.0f, 1.0f);
}

// Layer l's side tasks: its router's backward, then the pending weight gradients in the order they
// were left (the backend orders them by cost).
void ZayaModel::plan_backward_side_tasks(int l) {
  const double N = static_cast<double>(B_ * T_), H = static_cast<double>(cfg_.hidden_size),
               R = static_cast<double>(cfg_.router_hidden_size), E = static_cast<double>(cfg_.num_experts);
  side_tasks_.clear();
  // + the skip passthrough's ⟨dm, w⟩ over the skipped tokens (at most N) when it is on.
  const double skip = cfg_.skip_passthrough ? 2.0 * N * H : 0.0;
  side_tasks_.push_back({&ZayaModel::run_router_backward, this, l, 4.0 * N * (H * R + 2.0 * R * R + R * (E + 1.0)) + skip});
  for (size_t j = 0; j < pending_wgrads_.size(); ++j)
    side_tasks_.push_back({&ZayaModel::run_pending_weight_grad, this, static_cast<int64_t>(j),
                           2.0 * N * static_cast<double>(pending_wgrads_[j].C.numel())});
}

// The pending weight gradients dW += dyᵀ·x, all at once (independent GEMMs).
void ZayaModel::run_pending_weight_grads() {
  ops::gemm_many(pending_wgrads_, ops::Trans::T, ops::Trans::N, 1.0f, 1.0f);
  pending_wgrads_.clear();
}

void ZayaModel::layer_forward(int l, bool recomputing) {
  const int64_t N = B_ * T_, H = cfg_.hidden_size, kv = cfg_.kv_dim(), C = cfg_.conv_channels(),
                E = cfg_.num_experts;
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const ops::CcaDims dims{nq, nkv, hd};
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  const Tensor& x = s.xs[l];
  const bool b16 = gemm_dtype_ == DType::bf16;
  const bool a16 = activation_dtype_ == DType::bf16;  // o, m and the sequence ops' saved as bf16 copies only
  SectionClock clock(*this);

  // --- attention -------------------------------------------------------------------------
  clock.part("forward: input norm, qkv projection");
  ops::rmsnorm_forward(t.u, t.rstd_in, x, p.w_in, eps);
  if (b16) ops::cast_to_bf16(t.u16, t.u);
  const DenseGemms d = dense_gemms(l);
  // u·[W_q; W_k; W_vc; W_vd]ᵀ as one product per consumer, each on its rows of the fused weight
  // and into its own contiguous buffer: z = concat(q̃, k̃) (the conv's input, whose rows the mean
  // skip reads too) and [vc | vd] (the value shift's). One product into [N, C + kv] and a copy of
  // its column slices moved 8 MiB per layer for nothing.
  ops::linear_forward(t.z, d.u, d.w_qkv.slice(0, C), Tensor{});
  ops::linear_forward(s.vcd, d.u, d.w_qkv.slice(C, C + kv), Tensor{});
  if (cp_) {
    clock.part("forward: CCA and attention, context parallel");
    cp_attention_forward(l);
  } else {
    clock.part("forward: CCA (conv, mean skip, value shift, QK norm, RoPE)");
    ops::cca_conv_forward(s.conv, t.z, p.conv, B_, T_, dims);
    // Mean skip → QK norm → RoPE, one token at a time (bitwise the three ops in turn).
    ops::cca_qk_forward(t.qr, t.kr, t.qpre, t.kpre, s.conv, t.z, p.temp, rope_, B_, T_, dims);
    ops::value_shift_forward(t.v, s.vcd, B_, T_, kv / 2);
    clock.part("forward: attention");
    ops::attention_forward(t.att, t.lse, t.qr, t.kr, t.v, B_, T_, nq, nkv, hd);
  }
  if (a16)  // the layer's saved copies; the f32 values (shared scratch) are the next layer's to reuse
    for (auto [f32, b16copy] : t.sequence_copies()) ops::cast_to_bf16(*b16copy, *f32);
  clock.part("forward: out projection, residual");
  if (b16) ops::cast_to_bf16(t.att16, t.att);
  ops::linear_forward(t.o, d.att, d.w_o, Tensor{});
  ops::residual_scale_forward(t.x_mid, t.o, x, p.rs_attn);
  if (a16) ops::cast_to_bf16(t.o16, t.o);

  // --- router ----------------------------------------------------------------------------
  clock.part("forward: router");
  ops::rmsnorm_forward(t.w, t.rstd_post, t.x_mid, p.w_post, eps);
  if (b16) ops::cast_to_bf16(t.w16, t.w);
  ops::linear_forward(t.r, d.w, d.w_down, p.b_down);  // h_l = W_down w + b_down
  if (l > 0) ops::eda_forward(t.r, acts_[l - 1].r, p.s_eda);  // EDA: r_l = h_l + s_l ⊙ r_{l−1}
  ops::rmsnorm_forward(t.zr, t.rstd_r, t.r, p.w_rn, eps);
  if (b16) ops::cast_to_bf16(t.zr16, t.zr);
  ops::linear_forward(t.a1, d.zr, d.fc1w, p.fc1b);
  ops::gelu_forward(t.g1, t.a1);
  if (b16) ops::cast_to_bf16(t.g1_16, t.g1);
  ops::linear_forward(t.a2, d.g1, d.fc2w, p.fc2b);
  ops::gelu_forward(t.g2, t.a2);
  if (b16) ops::cast_to_bf16(t.g2_16, t.g2);
  ops::linear_forward(s.logits, d.g2, d.outw, Tensor{});
  Tensor beta = beta_.select(l);
  ops::moe_route(t.probs, t.choice, t.weight, s.logits, beta, N, E);

  // --- experts: grouped by expert, dropless ----------------------------------------------
  clock.part("forward: experts, residual");
  const int64_t forward_M = t.M;
  t.M = ops::moe_plan(t.counts, t.offsets, t.pos, t.src, t.choice, N, E);
  // A re-run is the same computation (set_recompute): the same tokens were routed.
  ZAYA_ASSERT(!recomputing || t.M == forward_M);
  // Tokens per expert to the host (the load statistics and the balancer read them there).
  if (!recomputing) Tensor::borrow(counts_host_.data() + l * E, Shape{E}, DType::i32).copy_from(t.counts);
  ops::experts_forward(expert_acts(l), t.w, t.src, t.offsets, expert_weights(l), t.M);
  ops::moe_unpermute(t.m, t.y, t.weight, t.pos, t.M, N, H);  // m = p_choice · y (0 if skipped)
  if (cfg_.skip_passthrough) ops::moe_skip_forward(t.m, t.w, t.probs, t.choice, N, E, H);  // m = p_skip · w if skipped
  if (a16) ops::cast_to_bf16(t.m16, t.m);
  if (!recomputing) ops::residual_scale_forward(s.xs[l + 1], t.m, t.x_mid, p.rs_mlp);
}

// In: s.dxa = dL/dx_out, s.drc = dL/dr_l from layer l+1 (0 for the last layer).
// Out: s.dxa = dL/dx_in, s.drc = dL/dr_{l−1}.
void ZayaModel::layer_backward(int l) {
  const int64_t N = B_ * T_, H = cfg_.hidden_size, kv = cfg_.kv_dim(), C = cfg_.conv_channels(),
                E = cfg_.num_experts;
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const ops::CcaDims dims{nq, nkv, hd};
  LayerActs& t = acts_[l];
  ScratchActs& s = *scratch_;
  const LayerParams& p = lp_[l];
  LayerParams& g = lg_[l];
  const Tensor& x = s.xs[l];
  const bool b16 = gemm_dtype_ == DType::bf16;
  const DenseGemms d = dense_gemms(l);
  // The residual scalings' h as saved: f32, or the bf16 copies (read widened, by ds_h only).
  const bool a16 = activation_dtype_ == DType::bf16;
  const Tensor& o_saved = a16 ? t.o16 : t.o;
  const Tensor& m_saved = a16 ? t.m16 : t.m;
  SectionClock clock(*this);
  // bf16 saved activations: the sequence ops' saved tensors back into their shared f32 scratch
  // (exact), which the f32 attention and CCA backward ops below read as t.z ... t.att. Here at the
  // start, since the overlapped context-parallel K/V gather reads kr and v from now on; nothing
  // before the attention's backward writes that scratch.
  if (a16) {
    clock.part("backward: widen the saved attention inputs");
    for (auto [f32, b16copy] : t.sequence_copies()) ops::cast_to_f32(*f32, *b16copy);
    ops::cast_to_f32(t.att, t.att16);
  }
  // Context parallel, overlapped: attention's K/V gather runs under the experts' backward.
  if (cp_ && cp_schedule_ == CpSchedule::overlapped) cp_start_kv_gather(l);

  // x_out = RS_mlp(m, x_mid)
  clock.part("backward: experts, residual (+ side tasks)");
  ops::residual_scale_backward(s.dm, s.dxmid, g.rs_mlp, s.dxa, m_saved, t.x_mid, p.rs_mlp);
  // m = weight · y[pos]; with bf16 saved activations from y's bf16 copy (t.y is shared scratch then)
  ops::moe_unpermute_backward(s.dy, s.dweight, s.dm, t.y16.defined() ? t.y16 : t.y, t.weight, t.pos, t.M, N, H);
  // The experts, with the router's backward and the pending weight gradients as side tasks (see
  // "Backward scheduling" above), which run here when the backend did not run them beside the
  // experts.
  plan_backward_side_tasks(l);
  const ops::ExpertScratch es{s.dact, s.dgu, s.dy16, s.dgu16};
  const bool side_done = ops::experts_backward(s.dxp, ops::ExpertWeights{g.w_gu, g.w_d}, s.dy, t.offsets, expert_weights(l),
                                               expert_acts(l), es, t.M, side_tasks_);
  if (!side_done) {
    run_pending_weight_grads();
    router_backward(l);
  }
  pending_wgrads_.clear();
  // The layer above is complete: its pending weight gradients were the last of it.
  if (l + 1 < cfg_.num_hidden_layers) report_ready_layer(l + 1);
  ops::moe_gather_backward(s.dw, s.dxp, t.pos, t.M, N, H);  // xp = w[src]
  if (cfg_.skip_passthrough) ops::moe_skip_input_backward(s.dw, s.dm, t.probs, t.choice, N, E, H);  // m = p_skip · w
  clock.part("backward: router");
  // h_l = W_down w + b_down; w also feeds the experts (s.dw from the gather).
  ops::linear_backward(s.dw, Tensor{}, Tensor{}, s.dr, d.w, d.w_down, s.dr16, /*accumulate_dx=*/true);
  // w = RMSNorm_post(x_mid); x_mid also feeds the residual (s.dxmid holds that path's gradient).
  ops::rmsnorm_backward(s.dxmid, g.w_post, s.dw, t.x_mid, p.w_post, t.rstd_post, /*accumulate_dx=*/true);

  // x_mid = RS_attn(o, x)
  clock.part("backward: out projection, residual");
  ops::residual_scale_backward(s.dout_proj, s.dxb, g.rs_attn, s.dxmid, o_saved, x, p.rs_attn);
  ops::linear_backward(s.datt, Tensor{}, Tensor{}, s.dout_proj, d.att, d.w_o, s.dout_proj16);
  // dW_o, pending; on the bf16 path from the dy copy linear_backward just made.
  pending_wgrads_.push_back({b16 ? s.dout_proj16 : s.dout_proj, d.att, g.w_o});
  if (cp_) {
    clock.part("backward: attention and CCA, context parallel");
    cp_attention_backward(l);
  } else {
    clock.part("backward: attention");
    ops::attention_backward(s.dqr, s.dkr, s.dv, s.datt, t.qr, t.kr, t.v, t.att, t.lse, B_, T_, nq, nkv, hd);
    clock.part("backward: CCA (RoPE, QK norm, mean skip, conv, value shift)");
    // dz: z reaches the loss through the mean skip (cca_qk_backward writes that part) and the conv
    // (added to it).
    ops::cca_qk_backward(s.dconv, s.dz, g.temp, s.dqr, s.dkr, t.qpre, t.kpre, p.temp, rope_, B_, T_, dims);
    ops::cca_conv_backward(s.dz, g.conv, s.dconv, t.z, p.conv, B_, T_, dims, /*accumulate_dz=*/true);
    ops::value_shift_backward(s.dvcd, s.dv, B_, T_, kv / 2);
  }
  clock.part("backward: qkv projection, input norm");
  // The forward's two products on row blocks of W_qkv: their weight gradients are the same row
  // blocks of g.w_qkv, and du sums the two.
  ops::linear_backward(s.du, Tensor{}, Tensor{}, s.dz, d.u, d.w_qkv.slice(0, C), s.dz16);
  ops::linear_backward(s.du, Tensor{}, Tensor{}, s.dvcd, d.u, d.w_qkv.slice(C, C + kv), s.dvcd16,
                       /*accumulate_dx=*/true);
  // Their weight gradients, pending.
  pending_wgrads_.push_back({b16 ? s.dz16 : s.dz, d.u, g.w_qkv.slice(0, C)});
  pending_wgrads_.push_back({b16 ? s.dvcd16 : s.dvcd, d.u, g.w_qkv.slice(C, C + kv)});
  ops::rmsnorm_backward(s.dxb, g.w_in, s.du, x, p.w_in, t.rstd_in, /*accumulate_dx=*/true);  // + the residual path
  std::swap(s.dxa, s.dxb);  // s.dxa = dL/dx_in
}

std::vector<RouterStats> ZayaModel::router_stats() const {
  std::vector<RouterStats> out;
  const int64_t E = cfg_.num_experts, N = B_ * T_;
  for (size_t l = 0; l < acts_.size(); ++l) {
    const LayerActs& t = acts_[l];
    RouterStats st;
    const int32_t* c = counts_host_.data() + static_cast<int64_t>(l) * E;
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

void ZayaModel::add_expert_counts(std::vector<int64_t>& counts) const {
  const size_t n = counts_host_.size();
  if (counts.empty()) counts.assign(n, 0);
  ZAYA_CHECK(counts.size() == n, "ZayaModel::add_expert_counts: counts has ", counts.size(),
             " entries, expected layers x experts = ", n);
  for (size_t i = 0; i < n; ++i) counts[i] += counts_host_[i];
}

Tensor ZayaModel::router_choice(int layer) const {
  ZAYA_CHECK(layer >= 0 && layer < cfg_.num_hidden_layers, "router_choice: layer ", layer, " out of range [0, ",
             cfg_.num_hidden_layers, ")");
  return acts_[layer].choice;
}

}  // namespace zaya::model
