// ZayaModel: parameters, activation planning, the embedding/head, and the layer forward/backward
// (written next to each other so the math of each step can be checked against its gradient).
#include "zaya/model/zaya_model.h"
#include "zaya/model/model_internal.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "zaya/core/random.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/loss.h"
#include "zaya/ops/moe.h"
#include "zaya/ops/scale_bias.h"

namespace zaya::model {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// splitmix64 finalizer: turns (seed, name hash) into a well-mixed Philox key.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

LayerParams layer_params(const ModelConfig& /*c*/, int l, const std::function<Tensor(const std::string&)>& get) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const std::string qkv = p + "self_attn.qkv_proj.";
  LayerParams lp;
  lp.w_in = get(p + "input_layernorm.weight");
  // q, k, v_current, v_delayed are adjacent in parameter_specs() order, so the caller turns q's
  // view into one [C + nkv·hd, H] window of the flat buffer: the fused projection.
  lp.w_qkv = get(qkv + "q_proj.weight");
  lp.conv = {get(qkv + "conv_qk_depthwise.weight"), get(qkv + "conv_qk_depthwise.bias"),
             get(qkv + "conv_qk_grouped.weight"), get(qkv + "conv_qk_grouped.bias")};
  lp.temp = get(p + "self_attn.qk_norm.temp");
  lp.w_o = get(p + "self_attn.o_proj.weight");
  auto rs = [&](const std::string& s) {
    return ops::ResidualScaleParams{get(s + "hidden_states_scale"), get(s + "hidden_states_bias"),
                                    get(s + "residual_scale"), get(s + "residual_bias")};
  };
  lp.rs_attn = rs(p + "post_attention_residual_scale.");
  lp.rs_mlp = rs(p + "post_mlp_residual_scale.");
  lp.w_post = get(p + "post_attention_layernorm.weight");
  const std::string g = p + "mlp.gate.";
  lp.w_down = get(g + "down_proj.weight");
  lp.b_down = get(g + "down_proj.bias");
  if (l > 0) lp.s_eda = get(g + "router_states_scale");
  lp.w_rn = get(g + "router_mlp.norm.weight");
  lp.fc1w = get(g + "router_mlp.fc1.weight");
  lp.fc1b = get(g + "router_mlp.fc1.bias");
  lp.fc2w = get(g + "router_mlp.fc2.weight");
  lp.fc2b = get(g + "router_mlp.fc2.bias");
  lp.outw = get(g + "router_mlp.out_proj.weight");
  lp.w_gu = get(p + "mlp.experts.gate_up_proj");
  lp.w_d = get(p + "mlp.experts.down_proj");
  return lp;
}

namespace {
// The skip class's balancing bias starts at −1 in every layer (DESIGN.md, "Router"); the rest at 0.
void reset_balancing_biases(const Tensor& beta, int64_t experts) {
  Tensor host = Tensor::zeros(beta.shape(), DType::f32);
  for (int64_t l = 0; l < beta.size(0); ++l) host.select(l).window(experts, Shape{1}).fill_(-1.0);
  Tensor(beta).copy_from(host);
}
}  // namespace

ZayaModel::ZayaModel(const ModelConfig& config, int64_t batch, int64_t seq_len, Device device)
    : cfg_(config), device_(device) {
  cfg_.validate("ZayaModel");
  specs_ = parameter_specs(cfg_);
  int64_t total = 0;
  for (const ParamSpec& s : specs_) total += s.shape.numel();
  params_ = Tensor::zeros(Shape{total}, DType::f32, device_);
  grads_ = Tensor::zeros(Shape{total}, DType::f32, device_);
  int64_t off = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    param_views_.push_back(params_.window(off, specs_[i].shape));
    grad_views_.push_back(grads_.window(off, specs_[i].shape));
    index_[specs_[i].name] = static_cast<int>(i);
    offsets_.push_back(off);
    off += specs_[i].shape.numel();
  }
  lp_ = layer_views(params_, [&](int i) { return param_views_[static_cast<size_t>(i)]; });
  lg_ = layer_views(grads_, [&](int i) { return grad_views_[static_cast<size_t>(i)]; });
  // Each layer's parameters are contiguous (parameter_specs() lists them layer by layer): the
  // ranges the backward reports as final.
  layer_ranges_.assign(static_cast<size_t>(cfg_.num_hidden_layers), {-1, -1});
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].layer < 0) continue;
    auto& [b, e] = layer_ranges_[static_cast<size_t>(specs_[i].layer)];
    if (b < 0) b = offsets_[i];
    ZAYA_ASSERT(e < 0 || e == offsets_[i]);
    e = offsets_[i] + specs_[i].shape.numel();
  }
  pending_wgrads_.reserve(4);  // a layer leaves three
  side_tasks_.reserve(5);
  counts_host_.assign(static_cast<size_t>(cfg_.num_hidden_layers * cfg_.num_experts), 0);
  beta_ = Tensor::zeros(Shape{cfg_.num_hidden_layers, cfg_.router_classes()}, DType::f32, device_);
  reset_balancing_biases(beta_, cfg_.num_experts);
  set_batch_shape(batch, seq_len);
}

ZayaModel::~ZayaModel() = default;

std::vector<LayerParams> ZayaModel::layer_views(const Tensor& flat, const std::function<Tensor(int)>& view) const {
  const Shape qkv_shape{cfg_.conv_channels() + cfg_.kv_dim(), cfg_.hidden_size};
  std::vector<LayerParams> out;
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    out.push_back(layer_params(cfg_, l, [&](const std::string& n) {
      const int i = param_index(n);
      ZAYA_CHECK(i >= 0, "ZayaModel: no parameter named '", n, "'");
      return view(i);
    }));
    const std::string qkv = "model.layers." + std::to_string(l) + ".self_attn.qkv_proj.";
    const int64_t q_off = offsets_[param_index(qkv + "q_proj.weight")];
    ZAYA_ASSERT(offsets_[param_index(qkv + "v_proj_delayed.weight")] ==
                q_off + (cfg_.conv_channels() + cfg_.kv_dim() / 2) * cfg_.hidden_size);
    out.back().w_qkv = flat.window(q_off, qkv_shape);
  }
  return out;
}

void ZayaModel::store_weights_bf16() {
  ZAYA_CHECK(params_.dtype() == DType::f32, "ZayaModel::store_weights_bf16: the weights are stored in bf16 already");
  ZAYA_CHECK(gemm_dtype_ == DType::bf16,
             "ZayaModel::store_weights_bf16: bf16 weights need bf16 GEMMs (set_gemm_dtype(DType::bf16) first): the "
             "GEMMs read the stored weights as they are");
  // Drop every reference the model holds to the f32 weights and their bf16 copies, so that the f32
  // buffer is freed once converted (unless the caller keeps it: the master weights of a rank that
  // owns them all do).
  Tensor f32 = params_;
  params_ = Tensor{};
  param_views_.assign(specs_.size(), Tensor{});
  lp_.clear();
  w_gu16_.clear();
  w_d16_.clear();
  dense16_.clear();
  emb16_ = Tensor{};
  Tensor w16;
  if (device_ != Device::cpu && f32.storage().use_count() == 1) {
    // Nobody else keeps it: through host memory, so that the device never holds both buffers.
    const Tensor host = f32.to(Device::cpu);
    f32 = Tensor{};
    w16 = Tensor::empty(host.shape(), DType::bf16, device_);
    const int64_t chunk = int64_t{16} << 20;  // elements per transfer: 64 MiB of f32 staging
    Tensor staging = Tensor::empty(Shape{std::min(chunk, host.numel())}, DType::f32, device_);
    for (int64_t at = 0; at < host.numel(); at += chunk) {
      const int64_t n = std::min(chunk, host.numel() - at);
      staging.window(0, Shape{n}).copy_from(host.window(at, Shape{n}));
      ops::cast_to_bf16(w16.window(at, Shape{n}), staging.window(0, Shape{n}));
    }
  } else {
    w16 = Tensor::empty(f32.shape(), DType::bf16, device_);
    ops::cast_to_bf16(w16, f32);
    f32 = Tensor{};
  }
  // The parameters f32 ops read, in runs of neighbours: one widening cast per run.
  small_segments_.clear();
  std::vector<int64_t> small_at(specs_.size(), -1);  // each small parameter's offset in small32_
  int64_t small = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].is_gemm_weight()) continue;
    const int64_t b = offsets_[i], e = b + specs_[i].shape.numel();
    if (!small_segments_.empty() && small_segments_.back().end == b)
      small_segments_.back().end = e;
    else
      small_segments_.push_back({b, e, small});
    small_at[i] = small;
    small += e - b;
  }
  small32_ = Tensor::empty(Shape{small}, DType::f32, device_);
  small_views_.assign(specs_.size(), Tensor{});
  for (size_t i = 0; i < specs_.size(); ++i)
    if (small_at[i] >= 0) small_views_[i] = small32_.window(small_at[i], specs_[i].shape);
  params_ = w16;
  for (size_t i = 0; i < specs_.size(); ++i) param_views_[i] = params_.window(offsets_[i], specs_[i].shape);
  widen_small(0, params_.numel());
  lp_ = layer_views(params_, [&](int i) { return f32_or_gemm_view(i); });
  make_gemm_weights();
}

Tensor ZayaModel::f32_or_gemm_view(int i) const {
  return specs_[static_cast<size_t>(i)].is_gemm_weight() ? param_views_[static_cast<size_t>(i)] : f32_param(i);
}

const Tensor& ZayaModel::f32_param(int i) const {
  if (small_views_.empty()) return param_views_[static_cast<size_t>(i)];
  const Tensor& t = small_views_[static_cast<size_t>(i)];
  ZAYA_ASSERT(t.defined());  // a GEMM weight has no f32 copy in bf16 storage
  return t;
}

void ZayaModel::widen_small(int64_t begin, int64_t end) {
  for (const SmallSegment& g : small_segments_) {
    const int64_t lo = std::max(begin, g.begin), hi = std::min(end, g.end);
    if (lo < hi)
      ops::cast_to_f32(small32_.window(g.at + lo - g.begin, Shape{hi - lo}), params_.window(lo, Shape{hi - lo}));
  }
}

void ZayaModel::need_weights(int64_t begin, int64_t end) {
  need_params(begin, end);
  widen_small(begin, end);
}

int ZayaModel::param_index(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}
Tensor ZayaModel::param(const std::string& name) const {
  int i = param_index(name);
  ZAYA_CHECK(i >= 0, "ZayaModel: no parameter named '", name, "'");
  return param_views_[i];
}
Tensor ZayaModel::grad(const std::string& name) const {
  int i = param_index(name);
  ZAYA_CHECK(i >= 0, "ZayaModel: no parameter named '", name, "'");
  return grad_views_[i];
}

std::vector<std::pair<std::string, Tensor>> ZayaModel::weights() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < specs_.size(); ++i) out.emplace_back(specs_[i].name, param_views_[i]);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l)
    out.emplace_back(balancing_bias_name(static_cast<int>(l)), beta_.select(l));
  return out;
}

const LayerParams& ZayaModel::layer_param_views(int l) const { return lp_.at(static_cast<size_t>(l)); }
const LayerActs& ZayaModel::layer_acts(int l) const {
  ZAYA_CHECK(!recompute_, "ZayaModel::layer_acts: with recompute on the forward keeps one layer's activations, "
             "not layer ", l, "'s; call set_recompute(false) before the forward that fills them");
  return acts_.at(static_cast<size_t>(l));
}
const Tensor& ZayaModel::layer_input(int l) const { return scratch_->xs.at(static_cast<size_t>(l)); }
const Tensor& ZayaModel::final_hidden() const { return scratch_->hf; }

void ZayaModel::init(uint64_t seed) {
  ZAYA_CHECK(params_.dtype() == DType::f32,
             "ZayaModel::init: the weights are stored in bf16; initialize before store_weights_bf16()");
  // Drawn on the host into views of a host buffer (the model's own on the CPU), then copied.
  Tensor host = device_ == Device::cpu ? params_ : Tensor::zeros(params_.shape(), DType::f32);
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    Tensor t = host.window(offsets_[i], s.shape);
    switch (s.init) {
      case InitKind::normal: fill_normal(t, mix(seed ^ mix(fnv1a(s.name))), 0, 0.0f, s.init_value); break;
      case InitKind::ones: t.fill_(1.0); break;
      case InitKind::zeros: t.zero_(); break;
      case InitKind::constant: t.fill_(s.init_value); break;
    }
    // The padding row is zero at init, as torch's nn.Embedding(padding_idx) leaves it.
    if (s.role == ParamRole::embedding && cfg_.pad_token_id >= 0 && cfg_.pad_token_id < cfg_.vocab_size)
      t.select(cfg_.pad_token_id).zero_();
  }
  if (device_ != Device::cpu) params_.copy_from(host);
  reset_balancing_biases(beta_, cfg_.num_experts);
}

void ZayaModel::set_batch_shape(int64_t batch, int64_t seq_len) {
  ZAYA_CHECK(batch > 0 && seq_len > 0, "ZayaModel: batch and sequence length must be positive, found [", batch,
             ", ", seq_len, "]");
  const int cp = cp_size();
  if (cp > 1) zigzag_chunk_len(seq_len, cp);  // throws unless the sequence splits into 2·cp chunks
  B_ = batch;
  S_ = seq_len;
  T_ = seq_len / cp;
  rope_ = ops::make_rope_table(cfg_.head_dim, cfg_.partial_rotary_factor, cfg_.rope_theta, S_, device_);
  plan();
  have_backward_ = false;
}

void ZayaModel::set_rope_theta(double theta) {
  ZAYA_CHECK(theta > 0 && std::isfinite(theta), "ZayaModel: rope_theta must be positive, found ", theta);
  cfg_.rope_theta = theta;
  rope_ = ops::make_rope_table(cfg_.head_dim, cfg_.partial_rotary_factor, cfg_.rope_theta, S_, device_);
}

void ZayaModel::set_context_parallel(ContextGroup* group, CpSchedule schedule) {
  cp_ = group && group->size() > 1 ? group : nullptr;
  cp_schedule_ = schedule;
  set_batch_shape(B_, S_);
}

void ZayaModel::set_gemm_dtype(DType dtype) {
  ZAYA_CHECK(dtype == DType::f32 || dtype == DType::bf16, "ZayaModel::set_gemm_dtype: expected f32 or bf16, found ",
             dtype_name(dtype));
  ZAYA_CHECK(dtype == DType::bf16 || params_.dtype() == DType::f32,
             "ZayaModel::set_gemm_dtype: the weights are stored in bf16 (store_weights_bf16), so the GEMMs take "
             "them in bf16");
  ZAYA_CHECK(dtype == DType::bf16 || activation_dtype_ == DType::f32,
             "ZayaModel::set_gemm_dtype: the saved activations are bf16 (set_activation_dtype), which needs bf16 "
             "GEMMs");
  gemm_dtype_ = dtype;
  // Over f32 storage the bf16 weight copies are made by the first forward (a run that then stores
  // its weights in bf16 never holds them); over bf16 storage the operands are the weights.
  if (dtype == DType::bf16 && params_.dtype() == DType::bf16)
    make_gemm_weights();
  else
    clear_gemm_weights();
  plan();
  have_backward_ = false;
}

// The bf16 GEMM path's weight operands: copies refreshed every forward over f32 storage, the
// weights themselves over bf16 storage.
void ZayaModel::clear_gemm_weights() {
  w_gu16_.clear();
  w_d16_.clear();
  dense16_.clear();
  emb16_ = Tensor{};
}

void ZayaModel::make_gemm_weights() {
  clear_gemm_weights();
  if (gemm_dtype_ != DType::bf16) return;
  const bool stored = params_.dtype() == DType::bf16;
  auto op = [&](const Tensor& w) { return stored ? w : Tensor::empty(w.shape(), DType::bf16, device_); };
  for (const LayerParams& p : lp_) {
    w_gu16_.push_back(op(p.w_gu));
    w_d16_.push_back(op(p.w_d));
    dense16_.push_back({op(p.w_qkv), op(p.w_o), op(p.w_down), op(p.fc1w), op(p.fc2w), op(p.outw)});
  }
  emb16_ = op(param_views_[0]);
}

void ZayaModel::set_activation_dtype(DType dtype) {
  ZAYA_CHECK(dtype == DType::f32 || dtype == DType::bf16, "ZayaModel::set_activation_dtype: expected f32 or bf16, found ",
             dtype_name(dtype));
  ZAYA_CHECK(dtype == DType::f32 || gemm_dtype_ == DType::bf16,
             "ZayaModel::set_activation_dtype: bf16 activations need bf16 GEMMs (set_gemm_dtype(DType::bf16) first)");
  activation_dtype_ = dtype;
  plan();
  have_backward_ = false;
}

void ZayaModel::set_recompute(bool on) {
  if (on == recompute_) return;
  recompute_ = on;
  plan();
  have_backward_ = false;
}

// Lays out every activation. Run twice: once counting bytes (with the arena's 64-byte alignment),
// once carving them out of an arena of exactly that size.
void ZayaModel::plan() {
  const int64_t N = B_ * T_, H = cfg_.hidden_size, L = cfg_.num_hidden_layers, q = cfg_.q_dim(),
                kv = cfg_.kv_dim(), C = cfg_.conv_channels(), R = cfg_.router_hidden_size, E = cfg_.num_experts,
                I = cfg_.moe_intermediate_size, V = cfg_.vocab_size, nq = cfg_.num_attention_heads;
  const bool b16 = gemm_dtype_ == DType::bf16;
  const bool a16 = activation_dtype_ == DType::bf16;  // needs b16 (set_activation_dtype)
  size_t counted = 0;
  bool counting = true;
  auto a = [&](Shape s, DType d = DType::f32) -> Tensor {
    if (!counting) return arena_.alloc(s, d);
    counted = (counted + kArenaAlign - 1) / kArenaAlign * kArenaAlign + static_cast<size_t>(s.numel()) * dtype_size(d);
    return Tensor{};
  };
  size_t layer_bytes = 0, kept_bytes = 0;
  auto run = [&] {
    acts_.assign(static_cast<size_t>(L), LayerActs{});
    scratch_ = std::make_unique<ScratchActs>();
    ScratchActs& s = *scratch_;
    s.xs.clear();
    for (int64_t l = 0; l <= L; ++l) s.xs.push_back(a({N, H}));
    Tensor u_odd, att_odd, u16_odd, att16_odd;  // recompute: the odd layers' u and att (and bf16 copies)
    // bf16 path: zr, g1 and g2, the experts' xp and act, and w unless the skip passthrough's
    // backward reads it, are f32 only on their way to their bf16 copies (model_internal.h).
    s.router_f32 = b16 ? a({N, R}) : Tensor{};
    const bool w_staged = b16 && !cfg_.skip_passthrough;
    s.w_f32 = w_staged ? a({N, H}) : Tensor{};
    s.xp_f32 = b16 ? a({N, H}) : Tensor{};
    s.act_f32 = b16 ? a({N, I}) : Tensor{};
    // bf16 path: u's f32 values only feed their bf16 copy (the cached decoder normalizes the layer
    // input again). bf16 saved activations: gu and y in f32 are one buffer each for every layer's
    // forward, and o and m share one block (o is spent before m is made); a layer keeps their bf16
    // copies (model_internal.h).
    s.u_f32 = b16 ? a({N, H}) : Tensor{};
    s.gu_f32 = a16 ? a({N, 2 * I}) : Tensor{};
    s.y_f32 = a16 ? a({N, H}) : Tensor{};
    s.rs_h_f32 = a16 ? a({N, H}) : Tensor{};
    // bf16 saved activations: the sequence ops' saved tensors in f32, one set for every layer (the
    // forward's values, then a layer's bf16 copies widened for its backward).
    if (a16) {
      s.z_f32 = a({N, C}); s.qpre_f32 = a({N, q}); s.kpre_f32 = a({N, kv});
      s.qr_f32 = a({N, q}); s.kr_f32 = a({N, kv}); s.v_f32 = a({N, kv}); s.att_f32 = a({N, q});
    }
    for (int64_t l = 0; l < L; ++l) {
      LayerActs& t = acts_[l];
      if (recompute_ && l > 0) {
        // Recompute: layer l's saved activations are views of layer 0's, the one shared set that
        // each layer's forward overwrites and its backward re-runs. A layer keeps its own router
        // state (the next layer's EDA reads it in the forward, its re-run and its backward) and
        // routing choice (router_choice()). u and att alternate between two buffers because the
        // weight gradients of layer l+1's projections (dW_o from att, dW_qkv from u) are still
        // pending while layer l is recomputed (zaya_layer.cc, "Backward scheduling"). On the bf16
        // path those GEMMs read the bf16 copies, which alternate; u's f32 is the shared scratch, and
        // so is att's with bf16 saved activations (only the attention's backward reads it then, from
        // att16 widened).
        if (l == 1) {
          u_odd = b16 ? s.u_f32 : a({N, H}); att_odd = a16 ? s.att_f32 : a({N, q});
          if (b16) { u16_odd = a({N, H}, DType::bf16); att16_odd = a({N, q}, DType::bf16); }
        }
        const size_t before = counted;
        t = acts_[0];
        t.r = a({N, R});
        t.choice = a({N}, DType::i32);
        if (l == 1) kept_bytes = counted - before;
        if (l % 2 == 1) { t.u = u_odd; t.att = att_odd; t.u16 = u16_odd; t.att16 = att16_odd; }
        continue;
      }
      size_t before = counted;
      t.rstd_in = a({N}); t.u = b16 ? s.u_f32 : a({N, H});
      if (a16) {  // the f32 values are shared scratch; the layer keeps bf16 copies (att: att16)
        t.z = s.z_f32; t.qpre = s.qpre_f32; t.kpre = s.kpre_f32;
        t.qr = s.qr_f32; t.kr = s.kr_f32; t.v = s.v_f32;
        t.att = s.att_f32;
        t.z16 = a({N, C}, DType::bf16); t.qpre16 = a({N, q}, DType::bf16); t.kpre16 = a({N, kv}, DType::bf16);
        t.qr16 = a({N, q}, DType::bf16); t.kr16 = a({N, kv}, DType::bf16); t.v16 = a({N, kv}, DType::bf16);
      } else {
        t.z = a({N, C}); t.qpre = a({N, q}); t.kpre = a({N, kv});
        t.qr = a({N, q}); t.kr = a({N, kv}); t.v = a({N, kv});
        t.att = a({N, q});
      }
      t.lse = cp_ ? a({2 * B_, nq, T_ / 2}) : a({B_, nq, T_});  // cp: one [nq, c] block per chunk
      t.o = a16 ? s.rs_h_f32 : a({N, H}); t.x_mid = a({N, H});
      t.rstd_post = a({N}); t.w = w_staged ? s.w_f32 : a({N, H});
      t.r = a({N, R}); t.rstd_r = a({N});
      t.a1 = a({N, R}); t.a2 = a({N, R});
      if (b16) {
        t.zr = t.g1 = t.g2 = s.router_f32;
        t.u16 = a({N, H}, DType::bf16); t.att16 = a({N, q}, DType::bf16); t.w16 = a({N, H}, DType::bf16);
        t.zr16 = a({N, R}, DType::bf16); t.g1_16 = a({N, R}, DType::bf16); t.g2_16 = a({N, R}, DType::bf16);
      } else {
        t.zr = a({N, R}); t.g1 = a({N, R}); t.g2 = a({N, R});
      }
      t.probs = a({N, E + 1}); t.choice = a({N}, DType::i32); t.weight = a({N});
      t.counts = a({E}, DType::i32); t.offsets = a({E + 1}, DType::i32);
      t.pos = a({N}, DType::i32); t.src = a({N}, DType::i32);
      t.xp = b16 ? s.xp_f32 : a({N, H});
      t.gu = a16 ? s.gu_f32 : a({N, 2 * I});
      t.act = b16 ? s.act_f32 : a({N, I});
      t.y = a16 ? s.y_f32 : a({N, H});
      t.m = a16 ? s.rs_h_f32 : a({N, H});
      if (a16) { t.o16 = a({N, H}, DType::bf16); t.m16 = a({N, H}, DType::bf16); }
      if (b16) { t.xp16 = a({N, H}, DType::bf16); t.act16 = a({N, I}, DType::bf16); }
      if (a16) { t.gu16 = a({N, 2 * I}, DType::bf16); t.y16 = a({N, H}, DType::bf16); }
      if (cp_) t.halo = a({4 * B_, C + kv});
      if (l == 0) layer_bytes = counted - before;
    }
    s.ids = a({B_, T_}, DType::i32);
    s.emb = a({N, H});
    s.hf = a({N, H}); s.rstd_f = a({N}); s.dh = a({N, H}); s.lse_ce = a({N});
    s.ce_ws = a({ops::cross_entropy_workspace_elems(N, V)});
    s.vcd = a({N, kv}); s.conv = a({N, C}); s.logits = a({N, E + 1});
    for (Tensor* g : {&s.dxa, &s.dxb, &s.dxmid, &s.dtmp, &s.dm, &s.dy, &s.dxp, &s.dw, &s.dout_proj, &s.du})
      *g = a({N, H});
    s.dweight = a({N}); s.dact = a({N, I}); s.dgu = a({N, 2 * I}); s.dlogits = a({N, E + 1});
    for (Tensor* g : {&s.dg2, &s.dg1, &s.dzr, &s.dr, &s.drc}) *g = a({N, R});
    s.datt = a({N, q}); s.dqr = a({N, q}); s.dkr = a({N, kv}); s.dv = a({N, kv});
    s.dconv = a({N, C}); s.dz = a({N, C}); s.dvcd = a({N, kv});
    if (cp_) {
      const int64_t K = cp_->size(), ext = 2 * B_ * (T_ / 2 + 2), S = S_;
      CpScratch& c = s.cp;
      c.tails = a({4 * B_, C + kv}); c.tails_all = a({K * 4 * B_, C + kv});
      c.hgrad = a({4 * B_, C + kv}); c.hgrad_all = a({K * 4 * B_, C + kv});
      c.z_ext = a({ext, C}); c.conv_ext = a({ext, C}); c.dz_ext = a({ext, C}); c.vcd_ext = a({ext, kv}); c.v_ext = a({ext, kv});
      for (Tensor* g : {&c.kg, &c.vg, &c.dkg, &c.dvg}) *g = a({K * N, kv});
      for (Tensor* g : {&c.kfull, &c.vfull, &c.dkfull, &c.dvfull}) *g = a({B_ * S, kv});
      if (cp_schedule_ == CpSchedule::overlapped) {  // the keys-before half, before its merge
        c.att_pre = a({N, q}); c.lse_pre = a({2 * B_, nq, T_ / 2});
        c.dk_own = a({N, kv}); c.dv_own = a({N, kv});
      }
    }
    if (b16) {
      s.dy16 = a({N, H}, DType::bf16); s.dgu16 = a({N, 2 * I}, DType::bf16);
      s.dout_proj16 = a({N, H}, DType::bf16); s.dz16 = a({N, C}, DType::bf16);
      s.dvcd16 = a({N, kv}, DType::bf16);
      s.dlogits16 = a({N, E + 1}, DType::bf16);
      for (Tensor* g : {&s.dg2_16, &s.dg1_16, &s.dr16}) *g = a({N, R}, DType::bf16);
      s.hf16 = a({N, H}, DType::bf16);
      s.g16 = a({N * std::min(V, ops::CrossEntropyOptions{}.chunk)}, DType::bf16);  // a loss chunk's G
    }
  };
  run();
  saved_per_layer_ = layer_bytes;
  kept_per_layer_ = recompute_ && L > 1 ? kept_bytes : layer_bytes;
  arena_ = Arena(counted + kArenaAlign, device_);
  counting = false;
  run();
  ZAYA_ASSERT(arena_.used() <= arena_.capacity());
}

double ZayaModel::forward(const Tensor& ids, const Tensor& targets, bool for_backward) {
  check_dtype("ZayaModel::forward: ids", ids, DType::i32);
  check_shape("ZayaModel::forward: ids", ids, Shape{B_, T_});
  if (targets.defined()) {
    check_dtype("ZayaModel::forward: targets", targets, DType::i32);
    check_shape("ZayaModel::forward: targets", targets, Shape{B_, T_});
  }
  const int64_t N = B_ * T_, L = cfg_.num_hidden_layers;
  ScratchActs& s = *scratch_;
  SectionClock clock(*this);
  clock.part("forward: embedding");
  s.ids.copy_from(ids);
  const bool b16 = gemm_dtype_ == DType::bf16;
  const bool stored16 = params_.dtype() == DType::bf16;  // bf16 weight storage: the GEMMs read the weights
  if (b16 && !emb16_.defined()) make_gemm_weights();
  const int norm = param_index("model.norm.weight");
  // x⁰ = (Embed[t] + b_in) ⊙ g_in: bias first, then scale, no √H.
  need_weights(0, layer_ranges_.empty() ? offsets_[norm] : layer_ranges_[0].first);
  ops::embedding_forward(s.emb, ids, param_views_[0]);
  ops::scale_bias_forward(s.xs[0], s.emb, f32_param(param_index("model.input_hidden_states_bias")),
                          f32_param(param_index("model.input_hidden_states_scale")));
  const bool need_backward = targets.defined() && for_backward;
  clock.stop();  // the layers time their own parts
  for (int l = 0; l < L; ++l) {
    if (param_need_ || b16) clock.part("forward: the layer's weights (all-gather wait, bf16 copies)");
    need_weights(layer_ranges_[l].first, layer_ranges_[l].second);
    if (b16 && !stored16) {  // the weights may have changed since the last step: refresh their bf16 copies
      ops::cast_to_bf16(w_gu16_[l], lp_[l].w_gu);
      ops::cast_to_bf16(w_d16_[l], lp_[l].w_d);
      cast_dense_weights(l);
    }
    clock.stop();
    layer_forward(l);
  }
  clock.part("forward: final norm, LM head, loss (and its backward)");
  need_weights(offsets_[norm], offsets_[norm] + specs_[norm].shape.numel());
  ops::rmsnorm_forward(s.hf, s.rstd_f, s.xs[L], f32_param(norm), static_cast<float>(cfg_.rms_norm_eps));
  have_backward_ = false;
  if (!targets.defined()) return 0;
  Tensor tg = targets.reshape(Shape{N});
  ops::CrossEntropyResult res;
  if (need_backward) {
    // The head's gradient into the tied embedding is accumulated here, in the same pass.
    if (b16) {  // bf16 copies of the GEMM inputs: the embedding may have changed since the last step
      ops::cast_to_bf16(s.hf16, s.hf);
      if (!stored16) ops::cast_to_bf16(emb16_, param_views_[0]);
      res = ops::cross_entropy_tied_forward_backward_bf16(s.dh, grad_views_[0], s.lse_ce, s.hf16, emb16_, tg,
                                                          s.ce_ws, s.g16);
    } else {
      res = ops::cross_entropy_tied_forward_backward(s.dh, grad_views_[0], s.lse_ce, s.hf, param_views_[0], tg,
                                                     s.ce_ws);
    }
    have_backward_ = true;
  } else if (stored16) {  // no f32 embedding to read: the head's GEMMs take bf16 as in training
    ops::cast_to_bf16(s.hf16, s.hf);
    res = ops::cross_entropy_tied_forward_bf16(s.lse_ce, s.hf16, emb16_, tg, s.ce_ws);
  } else {
    res = ops::cross_entropy_tied_forward(s.lse_ce, s.hf, param_views_[0], tg, s.ce_ws);
  }
  return res.loss;
}

void ZayaModel::forward_logits(const Tensor& ids, const Tensor& logits) {
  check_shape("ZayaModel::forward_logits: logits", logits, Shape{B_ * T_, cfg_.vocab_size});
  check_dtype("ZayaModel::forward_logits: logits", logits, DType::f32);
  forward(ids, Tensor{}, false);
  if (params_.dtype() == DType::bf16) {
    ops::cast_to_bf16(scratch_->hf16, scratch_->hf);
    ops::gemm(logits, scratch_->hf16, ops::Trans::N, emb16_, ops::Trans::T);
  } else {
    ops::gemm(logits, scratch_->hf, ops::Trans::N, param_views_[0], ops::Trans::T);
  }
}

ops::ExpertWeights ZayaModel::expert_weights(int l) const {
  if (gemm_dtype_ == DType::bf16) return {w_gu16_[static_cast<size_t>(l)], w_d16_[static_cast<size_t>(l)]};
  return {lp_[static_cast<size_t>(l)].w_gu, lp_[static_cast<size_t>(l)].w_d};
}

ops::ExpertActs ZayaModel::expert_acts(int l) const {
  const LayerActs& t = acts_[static_cast<size_t>(l)];
  return {t.xp, t.gu, t.act, t.y, t.xp16, t.act16, t.gu16, t.y16};
}

void ZayaModel::report_ready(int64_t begin, int64_t end) const {
  if (ready_ && *ready_ && begin < end) (*ready_)(begin, end);
}

void ZayaModel::report_ready_layer(int l) const {
  const auto [begin, end] = layer_ranges_[static_cast<size_t>(l)];
  report_ready(begin, end);
}

std::vector<std::pair<int64_t, int64_t>> ZayaModel::ready_order() const {
  return gradient_report_order(specs_);  // mirrors backward() below
}

// Re-runs layer l's forward from its saved input x^l (and r_{l−1}) into the shared activations,
// timed as one part of the backward.
void ZayaModel::recompute_layer(int l) {
  SectionClock clock(*this);
  clock.part("backward: recompute the layer's forward");
  struct Restore {
    bool& flag;
    bool was;
    ~Restore() { flag = was; }
  } restore{time_sections_, time_sections_};
  time_sections_ = false;  // the layer's own forward parts would count this time twice
  layer_forward(l, /*recomputing=*/true);
}

void ZayaModel::backward(const GradReadyFn& ready) {
  ZAYA_CHECK(have_backward_, "ZayaModel::backward: call forward(ids, targets, for_backward = true) first");
  have_backward_ = false;
  pending_wgrads_.clear();  // none left by a backward that threw
  struct ClearReady {
    const GradReadyFn*& r;
    ~ClearReady() { r = nullptr; }
  } clear_ready{ready_};
  ready_ = &ready;
  const int64_t L = cfg_.num_hidden_layers;
  ScratchActs& s = *scratch_;
  SectionClock clock(*this);
  clock.part("backward: final norm");
  const int norm = param_index("model.norm.weight");
  ops::rmsnorm_backward(s.dxa, grad_views_[norm], s.dh, s.xs[L], f32_param(norm), s.rstd_f);
  report_ready(offsets_[norm], offsets_[norm] + specs_[norm].shape.numel());
  s.drc.zero_();  // the last layer's router state feeds nothing
  clock.stop();
  for (int l = static_cast<int>(L) - 1; l >= 0; --l) {
    if (recompute_ && l + 1 < L) recompute_layer(l);  // the last layer's are still in the shared set
    layer_backward(l);
  }
  clock.part("backward: layer 0's projection weight gradients");
  run_pending_weight_grads();  // no experts region follows to take them (zaya_layer.cc)
  report_ready_layer(0);
  clock.part("backward: embedding");
  // x⁰ = (e + b) ⊙ g, e = Embed[ids].
  ops::scale_bias_backward(s.dtmp, grad("model.input_hidden_states_bias"), grad("model.input_hidden_states_scale"),
                           s.dxa, s.emb, f32_param(param_index("model.input_hidden_states_bias")),
                           f32_param(param_index("model.input_hidden_states_scale")));
  ops::embedding_backward(grad_views_[0], s.dtmp, s.ids, cfg_.pad_token_id);
  // The embedding and the input scale and bias: every parameter before layer 0's.
  report_ready(0, layer_ranges_.empty() ? offsets_[norm] : layer_ranges_[0].first);
}

}  // namespace zaya::model
