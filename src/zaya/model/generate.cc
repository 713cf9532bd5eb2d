// Cached decode and sampling (generate.h). The decode step is layer_forward (zaya_layer.cc) with one
// token per batch row: the sequence ops are replaced by their decode forms (cca_conv_decode,
// value_shift_decode, attention_decode against the cache, RoPE at the cache position); everything
// per-token (norms, projections, router, experts, residual scales) is the same op on B rows.
#include "zaya/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "zaya/core/error.h"
#include "zaya/core/philox.h"
#include "zaya/model/model_internal.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/copy.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/moe.h"
#include "zaya/ops/moe_skip.h"
#include "zaya/ops/router_state.h"
#include "zaya/ops/scale_bias.h"

namespace zaya::model {

ZayaDecoder::ZayaDecoder(ZayaModel& model, int64_t batch, int64_t max_len) : m_(model), B_(batch), S_(max_len) {
  const ModelConfig& c = m_.config();
  ZAYA_CHECK(batch > 0 && max_len > 0, "ZayaDecoder: batch and max_len must be positive, found [", batch, ", ",
             max_len, "]");
  ZAYA_CHECK(m_.weight_dtype() == DType::f32,
             "ZayaDecoder: the model's weights are stored in bf16 (a training run's); decode reads f32 weights: load "
             "the run's checkpoint, which holds the f32 master weights");
  // Checked before the caches (B·max_len rows per layer) are allocated.
  ZAYA_CHECK(max_len <= c.max_position_embeddings, "ZayaDecoder: max_len ", max_len,
             " exceeds the model's max_position_embeddings (", c.max_position_embeddings, ")");
  const int64_t B = B_, H = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), C = c.conv_channels(),
                R = c.router_hidden_size, E = c.num_experts, I = c.moe_intermediate_size,
                nkv = c.num_key_value_heads, hd = c.head_dim;
  rope_ = ops::make_rope_table(hd, c.partial_rotary_factor, c.rope_theta, S_, m_.device());
  for (int l = 0; l < c.num_hidden_layers; ++l)
    caches_.push_back({Tensor::zeros(Shape{B, S_, nkv, hd}, DType::f32, m_.device()),
                       Tensor::zeros(Shape{B, S_, nkv, hd}, DType::f32, m_.device()),
                       Tensor::zeros(Shape{B, 2, C}, DType::f32, m_.device()),
                       Tensor::zeros(Shape{B, kv / 2}, DType::f32, m_.device())});
  auto f = [&](Shape s) { return Tensor::zeros(s, DType::f32, m_.device()); };
  auto i32 = [&](Shape s) { return Tensor::zeros(s, DType::i32, m_.device()); };
  x_ = f({B, H}); u_ = f({B, H}); proj_ = f({B, C + kv}); z_ = f({B, C}); qt_ = f({B, q}); kt_ = f({B, kv});
  vc_ = f({B, kv / 2}); vd_ = f({B, kv / 2}); conv_ = f({B, C}); qpre_ = f({B, q}); kpre_ = f({B, kv});
  q_ = f({B, q}); k_ = f({B, kv}); v_ = f({B, kv}); att_ = f({B, q}); o_ = f({B, H}); xmid_ = f({B, H});
  rstd_ = f({B}); w_ = f({B, H}); r_ = f({B, R}); rprev_ = f({B, R}); zr_ = f({B, R}); a1_ = f({B, R});
  g1_ = f({B, R}); a2_ = f({B, R}); g2_ = f({B, R}); rlogits_ = f({B, E + 1}); probs_ = f({B, E + 1});
  choice_ = i32({B}); weight_ = f({B}); counts_ = i32({E}); offsets_ = i32({E + 1}); pos_ = i32({B});
  src_ = i32({B}); xp_ = f({B, H}); gu_ = f({B, 2 * I}); act_ = f({B, I}); y_ = f({B, H}); mo_ = f({B, H});
  hf_ = f({B, H});
}

void ZayaDecoder::prefill(const Tensor& ids, const Tensor& logits) {
  const ModelConfig& c = m_.config();
  check_dtype("ZayaDecoder::prefill: ids", ids, DType::i32);
  ZAYA_CHECK(ids.ndim() == 2 && ids.size(0) == B_ && ids.size(1) >= 1 && ids.size(1) <= S_,
             "ZayaDecoder::prefill: ids has shape ", ids.shape().str(), ", expected [", B_, ", T] with 1 <= T <= ",
             S_, " (the cache length)");
  check_shape("ZayaDecoder::prefill: logits", logits, Shape{B_, c.vocab_size});
  const int64_t T = ids.size(1), H = c.hidden_size, kv = c.kv_dim(), C = c.conv_channels();
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (m_.batch() != B_ || m_.seq_len() != T) m_.set_batch_shape(B_, T);
  // The caches are filled from every layer's saved f32 z, kr and v, which a model in recompute mode
  // or with bf16 saved activations does not keep (one shared set; the layers keep bf16 copies, and
  // rounded caches would change the tokens): the prefill runs without either (re-plans of the
  // arena) and turns them back on.
  struct SavedF32Activations {
    ZayaModel& m;
    bool recompute;
    DType activations;
    explicit SavedF32Activations(ZayaModel& model)
        : m(model), recompute(model.recompute()), activations(model.activation_dtype()) {
      m.set_recompute(false);
      if (activations != DType::f32) m.set_activation_dtype(DType::f32);
    }
    ~SavedF32Activations() {
      if (activations != DType::f32) m.set_activation_dtype(activations);
      m.set_recompute(recompute);
    }
  } saved_f32(m_);
  m_.forward(ids, Tensor{}, false);

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerActs& a = m_.layer_acts(l);
    LayerCache& lc = caches_[static_cast<size_t>(l)];
    const Tensor k_cache = lc.k.reshape({B_ * S_, kv}), v_cache = lc.v.reshape({B_ * S_, kv});
    const Tensor conv_state = lc.conv.reshape({B_ * 2, C});
    for (int64_t b = 0; b < B_; ++b) {
      // K/V rows of the prompt go to cache positions 0..T−1.
      ops::copy_block(k_cache, b * S_, 0, a.kr, b * T, 0, T, kv);
      ops::copy_block(v_cache, b * S_, 0, a.v, b * T, 0, T, kv);
      // Conv state: z_{T−2}, z_{T−1} (a prompt of one token leaves the padding zero in slot 0).
      for (int64_t s = 0; s < 2; ++s) {
        const int64_t t = T - 2 + s;
        if (t >= 0)
          ops::copy_block(conv_state, b * 2 + s, 0, a.z, b * T + t, 0, 1, C);
        else
          conv_state.slice(b * 2 + s, b * 2 + s + 1).zero_();
      }
      ops::copy_block(x_, b, 0, m_.layer_input(l), b * T + T - 1, 0, 1, H);  // the last token's layer input
    }
    // The forward does not keep vd; recompute the last token's from its normed input, normalized
    // again from the layer input x^l (the forward keeps u's f32 values only in f32 GEMM mode; the
    // norm is per row, so these are the forward's u bits): u = RMSNorm_in(x^l), vd = u·W_vdᵀ,
    // W_vd = the last nkv·hd/2 rows of the fused [W_q; W_k; W_vc; W_vd].
    const LayerParams& p = m_.layer_param_views(l);
    ops::rmsnorm_forward(u_, rstd_, x_, p.w_in, eps);
    ops::linear_forward(lc.vd_prev, u_, p.w_qkv.slice(C + kv / 2, C + kv), Tensor{});
  }
  for (int64_t b = 0; b < B_; ++b) ops::copy_block(hf_, b, 0, m_.final_hidden(), b * T + T - 1, 0, 1, H);
  ops::gemm(logits, hf_, ops::Trans::N, m_.param(0), ops::Trans::T);  // tied head
  len_ = T;
}

void ZayaDecoder::step(const Tensor& ids, const Tensor& logits) {
  const ModelConfig& c = m_.config();
  check_dtype("ZayaDecoder::step: ids", ids, DType::i32);
  ZAYA_CHECK(ids.numel() == B_, "ZayaDecoder::step: ids has shape ", ids.shape().str(), ", expected [", B_, "]");
  check_shape("ZayaDecoder::step: logits", logits, Shape{B_, c.vocab_size});
  ZAYA_CHECK(len_ > 0, "ZayaDecoder::step: call prefill() first");
  ZAYA_CHECK(len_ < S_, "ZayaDecoder::step: cache full (", S_, " positions); construct the decoder with a larger max_len");
  // x⁰ = (Embed[t] + b_in) ⊙ g_in
  ops::embedding_forward(u_, ids, m_.param(0));
  ops::scale_bias_forward(x_, u_, m_.param("model.input_hidden_states_bias"),
                          m_.param("model.input_hidden_states_scale"));
  for (int l = 0; l < c.num_hidden_layers; ++l) layer_step(l);
  ops::rmsnorm_forward(hf_, rstd_, x_, m_.param("model.norm.weight"), static_cast<float>(c.rms_norm_eps));
  ops::gemm(logits, hf_, ops::Trans::N, m_.param(0), ops::Trans::T);
  ++len_;
}

// x_ (layer input) → x_ (layer output) for the token at position len_.
void ZayaDecoder::layer_step(int l) {
  const ModelConfig& c = m_.config();
  const int64_t B = B_, H = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), C = c.conv_channels(),
                E = c.num_experts, nq = c.num_attention_heads,
                nkv = c.num_key_value_heads, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const ops::CcaDims dims{nq, nkv, hd};
  const LayerParams& p = m_.layer_param_views(l);
  LayerCache& lc = caches_[static_cast<size_t>(l)];

  // --- attention -------------------------------------------------------------------------
  ops::rmsnorm_forward(u_, rstd_, x_, p.w_in, eps);
  ops::linear_forward(proj_, u_, p.w_qkv, Tensor{});  // columns [q̃ | k̃ | vc | vd]
  ops::copy_block(z_, 0, 0, proj_, 0, 0, B, C);
  ops::copy_block(qt_, 0, 0, proj_, 0, 0, B, q);
  ops::copy_block(kt_, 0, 0, proj_, 0, q, B, kv);
  ops::copy_block(vc_, 0, 0, proj_, 0, C, B, kv / 2);
  ops::copy_block(vd_, 0, 0, proj_, 0, C + kv / 2, B, kv / 2);
  ops::cca_conv_decode(conv_, lc.conv, z_, p.conv, B, dims);  // sees z_{t−2}, z_{t−1}, z_t
  ops::mean_skip_forward(qpre_, kpre_, conv_, qt_, kt_, B, dims);
  ops::value_shift_decode(v_, lc.vd_prev, vc_, vd_, B, kv / 2);  // v = [vc_t | vd_{t−1}]
  ops::qk_norm_forward(q_, k_, qpre_, kpre_, p.temp, B, dims);
  ops::rope_forward(q_, q_, rope_, B, 1, nq, hd, len_);
  ops::rope_forward(k_, k_, rope_, B, 1, nkv, hd, len_);
  const Tensor k_cache = lc.k.reshape({B * S_, kv}), v_cache = lc.v.reshape({B * S_, kv});
  for (int64_t b = 0; b < B; ++b) {  // append this token's K/V at position len_
    ops::copy_block(k_cache, b * S_ + len_, 0, k_, b, 0, 1, kv);
    ops::copy_block(v_cache, b * S_ + len_, 0, v_, b, 0, 1, kv);
  }
  ops::attention_decode(att_, q_, lc.k, lc.v, B, len_ + 1, nq, nkv, hd);
  ops::linear_forward(o_, att_, p.w_o, Tensor{});
  ops::residual_scale_forward(xmid_, o_, x_, p.rs_attn);

  // --- router (EDA reads the previous layer's r of this same token) ------------------------
  ops::rmsnorm_forward(w_, rstd_, xmid_, p.w_post, eps);
  ops::linear_forward(r_, w_, p.w_down, p.b_down);
  if (l > 0) ops::eda_forward(r_, rprev_, p.s_eda);  // r_l = h_l + s_l ⊙ r_{l−1}
  ops::rmsnorm_forward(zr_, rstd_, r_, p.w_rn, eps);
  ops::linear_forward(a1_, zr_, p.fc1w, p.fc1b);
  ops::gelu_forward(g1_, a1_);
  ops::linear_forward(a2_, g1_, p.fc2w, p.fc2b);
  ops::gelu_forward(g2_, a2_);
  ops::linear_forward(rlogits_, g2_, p.outw, Tensor{});
  Tensor beta = m_.balancing_biases().select(l);
  ops::moe_route(probs_, choice_, weight_, rlogits_, beta, B, E);
  std::swap(r_, rprev_);  // rprev_ = r_l for layer l+1

  // --- experts ---------------------------------------------------------------------------
  const int64_t M = ops::moe_plan(counts_, offsets_, pos_, src_, choice_, B, E);
  ops::experts_forward({xp_, gu_, act_, y_, Tensor{}, Tensor{}}, w_, src_, offsets_, {p.w_gu, p.w_d}, M);
  ops::moe_unpermute(mo_, y_, weight_, pos_, M, B, H);
  if (c.skip_passthrough) ops::moe_skip_forward(mo_, w_, probs_, choice_, B, E, H);  // p_skip · w if skipped
  ops::residual_scale_forward(x_, mo_, xmid_, p.rs_mlp);  // x_out written over the layer input
}

int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& opt, uint64_t draw,
                     std::vector<float>& scratch, std::vector<int32_t>& order) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;  // strict: the lowest id wins a tie
  if (opt.greedy) return static_cast<int32_t>(best);
  ZAYA_CHECK(opt.temperature > 0 && std::isfinite(opt.temperature), "sampling: temperature must be > 0, found ",
             opt.temperature);
  ZAYA_CHECK(opt.top_p > 0 && opt.top_p <= 1, "sampling: top_p must be in (0, 1], found ", opt.top_p);
  ZAYA_CHECK(opt.top_k >= 0, "sampling: top_k must be 0 (all ids) or more, found ", opt.top_k);
  // Unnormalized probabilities exp((l − max)/T) in double, so the nucleus sum is exact enough that
  // top_p = 1 keeps every id with nonzero mass.
  scratch.resize(static_cast<size_t>(V));
  const double inv_t = 1.0 / opt.temperature, mx = logits[best];
  double total = 0;
  for (int64_t i = 0; i < V; ++i) {
    scratch[i] = static_cast<float>(std::exp((logits[i] - mx) * inv_t));
    total += scratch[i];
  }
  order.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
  int64_t keep = V;
  const bool cut_top_k = opt.top_k > 0 && opt.top_k < V;
  if (opt.top_p < 1 || cut_top_k) {
    // Descending probability, ties by id: a total order, so the kept set is deterministic.
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return scratch[a] != scratch[b] ? scratch[a] > scratch[b] : a < b;
    });
    if (cut_top_k) {
      keep = opt.top_k;
      total = 0;
      for (int64_t k = 0; k < keep; ++k) total += scratch[order[k]];
    }
    if (opt.top_p < 1) {  // the nucleus of what top_k kept
      const int64_t limit = keep;
      double acc = 0;
      for (keep = 0; keep < limit;) {
        acc += scratch[order[keep++]];
        if (acc >= opt.top_p * total) break;
      }
      total = acc;
    }
  }
  const double target = static_cast<double>(philox_uniform(opt.seed, draw)) * total;  // in [0, total)
  double acc = 0;
  for (int64_t k = 0; k < keep; ++k) {
    acc += scratch[order[k]];
    if (target < acc) return order[k];
  }
  // Rounding left target ≥ the last partial sum: take the last kept id with nonzero mass.
  for (int64_t k = keep - 1; k >= 0; --k)
    if (scratch[order[k]] > 0) return order[k];
  return static_cast<int32_t>(best);
}

std::vector<std::vector<int32_t>> generate(ZayaModel& model, const Tensor& prompt, const GenerateOptions& opt,
                                           GenerateStats* stats) {
  check_dtype("generate: prompt", prompt, DType::i32);
  ZAYA_CHECK(prompt.ndim() == 2 && prompt.size(1) >= 1, "generate: prompt must be [B, T] with T >= 1, found ",
             prompt.shape().str());
  ZAYA_CHECK(opt.max_new >= 0, "generate: max_new must be >= 0, found ", opt.max_new);
  const int64_t B = prompt.size(0), T0 = prompt.size(1), V = model.config().vocab_size,
                P = model.config().max_position_embeddings;
  // Positions past max_position_embeddings are ones the model never trained on; the bound also
  // caps the decode caches, which are sized by T0 + max_new before the first token.
  ZAYA_CHECK(T0 <= P && opt.max_new <= P - T0, "generate: the prompt's ", T0, " tokens + max_new ", opt.max_new,
             " exceed the model's max_position_embeddings (", P, ")");
  ZAYA_CHECK(opt.eos_token_id >= -1 && opt.eos_token_id < V, "generate: eos_token_id must be a token id in [0, ",
             V, ") or -1 (never stop), found ", opt.eos_token_id);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  if (opt.max_new == 0) return out;
  ZayaDecoder dec(model, B, T0 + opt.max_new);
  // Sampling runs on the host: the decoder writes its logits straight into host memory on the CPU
  // and into a device tensor copied back once per token elsewhere; the sampled ids go in as host
  // data.
  const bool on_host = model.device() == Device::cpu;
  std::vector<float> host_logits(static_cast<size_t>(B * V));
  const Tensor host_view = Tensor::borrow(host_logits.data(), Shape{B, V}, DType::f32);
  const Tensor logits = on_host ? host_view : Tensor::empty(Shape{B, V}, DType::f32, model.device());
  std::vector<int32_t> next_ids(static_cast<size_t>(B), 0);
  const Tensor next_host = Tensor::borrow(next_ids.data(), Shape{B}, DType::i32);
  const Tensor next = on_host ? next_host : Tensor::empty(Shape{B}, DType::i32, model.device());
  std::vector<char> done(static_cast<size_t>(B), 0);
  std::vector<float> scratch;
  std::vector<int32_t> order;
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const Clock::time_point t0 = Clock::now();
  dec.prefill(prompt.device() == model.device() ? prompt : prompt.to(model.device()), logits);
  // The logits are on the host when the prefill returns on the CPU; elsewhere the first copy
  // below waits for them, so the decode time includes that wait.
  const Clock::time_point t1 = Clock::now();
  if (stats && stats->after_prefill) stats->after_prefill();
  int64_t steps = 0;
  for (int64_t step = 0; step < opt.max_new; ++step) {
    if (!on_host) Tensor(host_view).copy_from(logits);
    int64_t active = 0;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      const uint64_t draw = static_cast<uint64_t>(step) * static_cast<uint64_t>(B) + static_cast<uint64_t>(b);
      const int32_t id = sample_token(host_logits.data() + b * V, V, opt.sampling, draw, scratch, order);
      out[b].push_back(id);
      next_ids[static_cast<size_t>(b)] = id;  // a finished row keeps feeding its last id; its logits are unused
      if (id == opt.eos_token_id) done[b] = 1;
      else ++active;
    }
    if (active == 0 || step + 1 == opt.max_new) break;
    if (!on_host) Tensor(next).copy_from(next_host);
    dec.step(next, logits);
    ++steps;
  }
  if (stats) {
    stats->prefill_s = seconds(t0, t1);
    stats->decode_s = seconds(t1, Clock::now());
    stats->decode_steps = steps;
  }
  return out;
}

}  // namespace zaya::model
