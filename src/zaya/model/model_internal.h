// Internal to the model layer: the saved-activation and parameter-view structs shared by
// zaya_model.cc (planning, embedding, head) and zaya_layer.cc (the decoder layer).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/model/config.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/profile.h"
#include "zaya/ops/dense.h"
#include "zaya/model/zaya_model.h"

namespace zaya::model {

// Times consecutive parts of a step into ZayaModel::section_times() when the model's section
// timing is on: part("name") ends the running part and starts the next; the last one ends with
// the clock. One line per part, so the layer code still reads top to bottom.
class SectionClock {
 public:
  explicit SectionClock(ZayaModel& m) : m_(m) {}
  ~SectionClock() { stop(); }
  void part(const char* name) {
    if (!m_.time_sections_) return;
    stop();
    name_ = name;
    gemm0_ = ops::gemm_seconds(m_.device());
    t0_ = std::chrono::steady_clock::now();
  }
  void stop() {
    if (name_ == nullptr) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double g = ops::gemm_seconds(m_.device()) - gemm0_;
    auto it = std::find_if(m_.sections_.begin(), m_.sections_.end(), [&](const auto& x) { return x.name == name_; });
    if (it == m_.sections_.end()) it = m_.sections_.insert(m_.sections_.end(), {name_, 0, 0.0, 0.0});
    it->calls += 1;
    it->seconds += s;
    it->gemm_seconds += g;
    name_ = nullptr;
  }

 private:
  ZayaModel& m_;
  const char* name_ = nullptr;
  double gemm0_ = 0.0;  // the GEMM clock (ops::gemm_seconds) when the part began
  std::chrono::steady_clock::time_point t0_;
};

// Saved activations of one layer (N = B·T rows). Everything backward needs, nothing else.
struct LayerActs {
  Tensor rstd_in, u;              // input RMSNorm
  Tensor z;                       // conv input concat(q̃, k̃) [N, C]
  Tensor qpre, kpre;              // q, k after conv + mean skip (QK-norm inputs)
  Tensor qr, kr, v;               // post-norm, post-RoPE q and k; shifted values
  Tensor att, lse;                // attention output [N, nq·hd] and row logsumexp [B, nq, T]
  Tensor o;                       // o_proj output (RS_attn's h)
  Tensor x_mid;                   // residual stream after attention (fp32)
  Tensor rstd_post, w;            // post-attention RMSNorm
  Tensor r;                       // router state after EDA [N, R] (handed to the next layer)
  Tensor rstd_r, zr, a1, g1, a2, g2;  // router MLP: norm, fc1 pre/post GELU, fc2 pre/post GELU
  Tensor probs, choice, weight;   // routing
  Tensor counts, offsets, pos, src;  // permutation plan
  int64_t M = 0;                  // routed tokens
  Tensor xp, gu, act, y;          // experts: gathered input, [g; v], SiLU(g)⊙v, output (permuted)
  Tensor m;                       // MoE output (RS_mlp's h)
  // bf16 GEMM path: bf16 copies of xp and act (the GEMM inputs). The experts' backward reads these
  // and not xp and act, so in this mode xp and act are views of shared scratch (ScratchActs).
  Tensor xp16, act16;
  // bf16 GEMM path: the dense projections' inputs in bf16 (their forward and weight-gradient GEMMs
  // read these). att stays f32 besides (the attention's backward reads it; with bf16 saved
  // activations from att16 widened into shared scratch, see below). u feeds only its GEMMs
  // after the forward (the cached decoder normalizes the layer input again), so its f32 field is a
  // view of shared scratch. w is read in f32 only in the forward (the experts' gather) unless the
  // skip passthrough's backward reads it too, so without the passthrough its f32 field is a view of
  // shared scratch; zr, g1 and g2 feed only their GEMMs, so their f32 fields are views of one
  // shared scratch row block. Only the bf16 copies of those are kept per layer.
  Tensor u16, att16, w16, zr16, g1_16, g2_16;
  // bf16 saved activations (set_activation_dtype), the experts' part: gu and y are f32 only for the
  // forward (the SwiGLU and the combine read them there), views of shared scratch (ScratchActs);
  // each layer keeps their bf16 copies, which the SwiGLU's and the combine's backwards read.
  Tensor gu16, y16;
  // bf16 saved activations (ZayaModel::set_activation_dtype): the residual scalings' h, o (RS_attn)
  // and m (RS_mlp). Their forwards read the f32 values, views of one shared scratch block
  // (ScratchActs::rs_h_f32: o is spent before m is made); only ds_h of their backwards reads h, from
  // these bf16 copies.
  Tensor o16, m16;
  // bf16 saved activations, the sequence ops' part: the conv input z, the QK-norm inputs qpre and
  // kpre, and the attention's inputs qr, kr, v. Their f32 fields are views of shared scratch
  // (ScratchActs::z_f32 ...) that the forward computes from; each layer keeps these bf16 copies,
  // which the layer's backward widens exactly back into that scratch before the f32 backward ops
  // (and the context-parallel K/V gather) read it. att works the same way with att16, the o_proj
  // GEMM's copy. The ops, the CPU's attention kernels among them, so stay f32 throughout.
  Tensor z16, qpre16, kpre16, qr16, kr16, v16;
  // Those six as (f32 field, bf16 copy) pairs, in one list for the forward's rounding and the
  // backward's widening.
  std::array<std::pair<Tensor*, Tensor*>, 6> sequence_copies() {
    return {{{&z, &z16}, {&qpre, &qpre16}, {&kpre, &kpre16}, {&qr, &qr16}, {&kr, &kr16}, {&v, &v16}}};
  }
  // Context parallelism: each chunk's halo, the two positions before it [B·2·2, C + nkv·hd]
  // (z's columns, then [vc | vd]; zeros before the sequence), as the conv and value shift saw it.
  Tensor halo;
};

// Context-parallel temporaries (cp > 1 only), shared by all layers. "ext" buffers hold each chunk
// with its halo in front: [B·2, c + 2, F], so the single-device conv and value-shift ops run on
// them unchanged. Gathered buffers are rank-major [cp, B·2c, F]; "full" ones are in sequence order
// [B, S, F].
struct CpScratch {
  Tensor tails, tails_all;        // each chunk's last two positions [B·2·2, C + kv], gathered
  Tensor z_ext, conv_ext, vcd_ext, v_ext, dz_ext;
  Tensor kg, vg, kfull, vfull;    // post-RoPE K and V: gathered, then in sequence order
  Tensor dkfull, dvfull, dkg, dvg;  // their gradients, in sequence order, then rank-major to scatter
  Tensor hgrad, hgrad_all;        // halo gradients [B·2·2, C + kv], gathered
  // CpSchedule::overlapped: each chunk's attention over the keys before it [N, nq·hd] and its lse
  // [2B, nq, c], merged into the own-keys half; the own keys' dK, dV [N, kv], added after the
  // reduce-scatter of the rest.
  Tensor att_pre, lse_pre, dk_own, dv_own;
};

// Temporaries shared by all layers: forward splits and the backward's gradient buffers.
struct ScratchActs {
  Tensor ids;                        // copy of the last forward's ids [B, T] i32
  Tensor emb;                        // Embed[t], saved for the input scale's gradient
  std::vector<Tensor> xs;            // residual stream x^0..x^L [N, H]
  Tensor hf, rstd_f, dh, lse_ce, ce_ws;  // final norm and loss
  Tensor vcd, conv, logits;          // forward temporaries; vcd: [vc | vd] per row
  Tensor dxa, dxb, dxmid, dtmp, dm, dy, dweight, dact, dgu, dxp, dw, dlogits, dg2, dg1, dzr, dr, drc;
  Tensor dout_proj, datt, dqr, dkr, dv, dconv, dz, dvcd, du;
  Tensor dy16, dgu16, hf16, g16;  // bf16 GEMM path: bf16 copies of GEMM inputs
  // bf16 GEMM path: the dense projections' output gradients rounded to bf16 (linear_backward's dy
  // workspace). dout_proj16, dz16 and dvcd16 are read again by the pending weight gradients, as
  // their f32 sources are; the router's are its own (its backward may run beside the experts').
  Tensor dout_proj16, dz16, dvcd16, dlogits16, dg2_16, dg1_16, dr16;
  Tensor router_f32;  // [N, R]: zr, g1 and g2 in f32 before their bf16 copies (bf16 path)
  // bf16 path: the f32 values each layer's forward makes on their way to their bf16 copies and
  // reads no more after its forward: w [N, H] (without the skip passthrough), the experts' gathered
  // input xp [N, H] and SwiGLU output act [N, I]. One buffer each: w is the gather's source of xp,
  // and a backend may run an expert's gather beside another's SwiGLU.
  Tensor w_f32, xp_f32, act_f32;
  // bf16 saved activations, the experts' part: gu [N, 2I] and y [N, H] in f32, shared by every
  // layer's forward (each layer keeps gu16 and y16).
  Tensor gu_f32, y_f32;
  // bf16 path: the input RMSNorm's output u [N, H] in f32, read by its forward GEMMs' bf16 cast only.
  Tensor u_f32;
  // bf16 saved activations: o and m in f32 [N, H], each read only by its residual scaling's forward.
  Tensor rs_h_f32;
  // bf16 saved activations: the sequence ops' saved tensors in f32 (LayerActs::z16 ...), one set for
  // every layer: the forward writes them and casts them to the layer's bf16 copies; the backward
  // widens a layer's copies back into them. Nothing reads them across layers.
  Tensor z_f32, qpre_f32, kpre_f32, qr_f32, kr_f32, v_f32, att_f32;
  CpScratch cp;
};

// Views of one layer's parameters (or of their gradients: same layout in the grad buffer).
struct LayerParams {
  Tensor w_in, w_qkv, temp, w_o, w_post, w_down, b_down, s_eda, w_rn, fc1w, fc1b, fc2w, fc2b, outw, w_gu, w_d;
  ops::CcaConvWeights conv;
  ops::ResidualScaleParams rs_attn, rs_mlp;
};

// Views of layer l's tensors through `get` (parameters or their gradients).
LayerParams layer_params(const ModelConfig& c, int l, const std::function<Tensor(const std::string&)>& get);

}  // namespace zaya::model
