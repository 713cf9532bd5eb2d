// ZayaModel: the ZAYA1 decoder (DESIGN.md, "The ZAYA1 model, exactly") with an explicit forward and
// backward (the llm.c way): every parameter is a named view into one flat f32 buffer, gradients
// likewise, and every activation comes from one arena sized at construction for a fixed (B, T), so a
// step allocates nothing. The model is the math only: it calls ops:: fronts on tensors of its device
// and never touches tensor memory itself (what the host must know, the tokens per expert, comes back
// through one explicit copy per layer).
//
// Usage: ZayaModel m(cfg, B, T); m.init(seed); loss = m.forward(ids, targets); m.backward();
// Gradients accumulate into grads() until zero_grad().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zaya/core/arena.h"
#include "zaya/core/tensor.h"
#include "zaya/model/config.h"
#include "zaya/model/context_parallel.h"
#include "zaya/model/params.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/loss.h"
#include "zaya/ops/rope.h"

namespace zaya::model {

// Per-layer routing statistics of the last forward.
struct RouterStats {
  std::vector<int64_t> tokens_per_expert;  // [E]
  int64_t skipped = 0;                     // tokens that chose the skip class
  double load_entropy = 0;                 // −Σ f_e ln f_e / ln E over routed tokens (1 = balanced)
};

struct LayerActs;     // saved activations of one layer (zaya_model.cc)
struct ScratchActs;   // backward temporaries
struct LayerParams;   // views of one layer's parameters

class ZayaModel {
 public:
  // Allocates parameters, gradients (zeroed), balancing biases and the activation arena on `device`
  // for batches of exactly [B, T] tokens. Parameters are left zero until init() or a load.
  ZayaModel(const ModelConfig& config, int64_t batch, int64_t seq_len, Device device = Device::cpu);
  ~ZayaModel();
  ZayaModel(const ZayaModel&) = delete;
  ZayaModel& operator=(const ZayaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return S_; }        // the sequence's tokens (over every cp rank)
  int64_t local_seq_len() const { return T_; }  // the tokens of each sequence on this rank: seq_len / cp

  // Re-plans the activation arena for another [B, S] (allocates: not for the hot loop). With
  // context parallelism S must split into 2·cp equal chunks (zaya::Error naming parallel.cp).
  void set_batch_shape(int64_t batch, int64_t seq_len);
  // Context parallelism over `group` (context_parallel.h; null: none). This rank then holds its
  // zigzag part of each sequence: forward takes ids and targets [B, seq_len / cp] in that layout,
  // the loss is the mean over this rank's tokens, and the parameter gradients are this rank's
  // part of the gradient of Σ_ranks loss_rank (a rank's loss reaches the others' parameters
  // through the exchanged K/V and halo): their sum over the group. When every rank counts the same
  // number of targets, that sum is cp × the gradient of the mean over the whole sequences. Every rank of
  // the group runs forward and backward together. The group must outlive the model or the next
  // call. Re-plans the arena (allocates). At cp = 1 (or null) the model is the plain single-device
  // one, bit for bit.
  // `schedule`: how attention meets the K/V exchange (CpSchedule, context_parallel.h).
  void set_context_parallel(ContextGroup* group, CpSchedule schedule = CpSchedule::overlapped);
  CpSchedule cp_schedule() const { return cp_schedule_; }
  int cp_size() const { return cp_ ? cp_->size() : 1; }
  // Switches the RoPE base θ (a training recipe's context-extension phase): config().rope_theta
  // and the rotation table change; parameters, gradients and the arena do not.
  void set_rope_theta(double theta);

  // GEMM inputs of the training step: f32 (default, exact fp32 math) or bf16 (every weight GEMM: the
  // experts', the attention projections' (qkv, o), the router's (down, fc1, fc2, out) and the tied
  // LM head's in the training forward and backward take bf16 copies of their weights and inputs,
  // refreshed every forward; f32 accumulation and outputs; the residual stream, norms, attention,
  // softmax and loss stay fp32; a forward without backward keeps the head f32). Re-plans the arena
  // (allocates).
  void set_gemm_dtype(DType dtype);
  DType gemm_dtype() const { return gemm_dtype_; }

  // Saved activations: f32 (default), or bf16 (needs bf16 GEMMs): the large tensors that the
  // backward reads outside the GEMMs (element-wise, CCA and attention ops) are saved as bf16
  // copies only. The forward computes from their f32 values, as in f32 mode, so the forward and
  // the loss are unchanged; the backward reads the rounded values. The residual stream, the norms'
  // statistics and attention's logsumexp stay f32. Which tensors: LayerActs in model_internal.h.
  // Re-plans the arena (allocates).
  void set_activation_dtype(DType dtype);
  DType activation_dtype() const { return activation_dtype_; }

  // Weight storage: f32 (default) or bf16, the mixed precision ZAYA1 trained with
  // (train.param_dtype = "bf16"; the fp32 master weights live with the optimizer,
  // train/master_weights.h). store_weights_bf16() rounds the current values to bf16 (nearest even)
  // into a flat bf16 buffer of the same layout and frees the f32 one: params_flat() and the
  // parameter views are bf16 from then on, half the bytes. The weight GEMMs read the bf16 weights
  // as they are (it needs gemm_dtype() bf16: no per-forward weight copies), the embedding lookup
  // reads bf16 rows, and the few parameters f32 ops read (norm weights, biases, temperatures,
  // the conv and residual-scale parameters: under 1% of a layer) are widened into a small f32
  // copy as the forward reaches them. Gradients stay f32. One-way: init() and loads need f32
  // storage, so a run sets its weights first; views taken before the call keep the freed buffer.
  void store_weights_bf16();
  DType weight_dtype() const { return params_.dtype(); }

  // Activation recomputation (off by default). On, the forward keeps per layer only what the
  // layers after it read (its input x^l, its router state r_l for the next layer's depth average,
  // its routing choice and counts) and one shared set of saved activations; backward() re-runs
  // layer l's forward from x^l just before layer l's backward (the last layer's are still there).
  // The recomputed forward is the same deterministic computation, so the loss and every gradient
  // are bitwise those without it; the arena shrinks from L layers' saved activations to about one,
  // for the time of L − 1 layer forwards more per step. layer_acts() needs it off. Re-plans the
  // arena (allocates).
  void set_recompute(bool on);
  bool recompute() const { return recompute_; }

  // Deterministic init from `seed` following each ParamSpec's init; each parameter draws from its
  // own Philox stream keyed by (seed, hash of its HF name), so adding or reordering parameters
  // does not change the others. Balancing biases are reset to 0 (skip class −1).
  void init(uint64_t seed);

  // Parameters and gradients: flat buffers and named views (HF names); the parameters f32 or bf16
  // (weight_dtype()), the gradients f32.
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const Tensor& params_flat() const { return params_; }
  const Tensor& grads_flat() const { return grads_; }
  const Tensor& param(int i) const { return param_views_[i]; }
  const Tensor& grad(int i) const { return grad_views_[i]; }
  Tensor param(const std::string& name) const;  // throws naming `name` if unknown
  Tensor grad(const std::string& name) const;
  int param_index(const std::string& name) const;  // −1 if unknown
  int64_t param_offset(int i) const { return offsets_[static_cast<size_t>(i)]; }  // in the flat buffers
  // Balancing biases β, [L, E+1] f32: not parameters (no loss gradient).
  const Tensor& balancing_biases() const { return beta_; }
  void zero_grad() { grads_.zero_(); }
  // Views of every tensor of a model checkpoint, named and ordered as weight_shapes(config()):
  // the parameters, then each layer's balancing biases.
  std::vector<std::pair<std::string, Tensor>> weights() const;

  // Forward over ids [B, T] i32. With targets [B, T] i32 (−100 = ignored) returns the mean
  // cross-entropy through the chunked fused loss; when `for_backward` the loss gradient wrt the
  // final hidden states is computed in the same pass (and the embedding's head gradient is
  // accumulated), ready for backward(). Without targets returns 0.
  double forward(const Tensor& ids, const Tensor& targets = {}, bool for_backward = true);
  // Logits [B·T, V] for ids [B, T] (no loss; the full vocabulary matrix is materialized).
  void forward_logits(const Tensor& ids, const Tensor& logits);
  // Backpropagates the last forward(ids, targets, true) into every parameter gradient (+=).
  // `ready`, when given, is called with each flat range [begin, end) of the gradient buffer (element
  // offsets into grads_flat()) as soon as nothing in this backward will change it again, in that
  // order: the final norm first, then the layers from the last to the first, then the embedding and
  // the input scale and bias. The ranges cover every parameter exactly once. This is where gradient
  // buckets start their reductions while the backward goes on.
  using GradReadyFn = std::function<void(int64_t begin, int64_t end)>;
  void backward(const GradReadyFn& ready = {});
  // The ranges backward reports to `ready`, in the order it reports them (the same every backward):
  // what a data-parallel bucket plan is built from.
  std::vector<std::pair<int64_t, int64_t>> ready_order() const;
  // Called by every forward with each flat parameter range [begin, end) just before the forward
  // first reads it, in forward order: the embedding and the input scale and bias, the layers from
  // the first to the last, then the final norm — ready_order() reversed, so the same ranges. Where
  // ZeRO-1's parameter all-gather, prefetched under the next forward, waits for the buckets a range
  // needs (train/grad_sync.h). Null: none.
  using ParamNeedFn = std::function<void(int64_t begin, int64_t end)>;
  void set_param_need(ParamNeedFn need) { param_need_ = std::move(need); }
  // Layer l's parameters as one flat range [begin, end) (they are contiguous in the buffers).
  std::pair<int64_t, int64_t> layer_range(int l) const { return layer_ranges_.at(static_cast<size_t>(l)); }

  // Routing statistics of the last forward, one entry per layer.
  std::vector<RouterStats> router_stats() const;
  // Adds the last forward's per-layer routed-token counts (real experts, skip excluded) to
  // `counts` [L·E], layer-major, resizing it on first use: what the balancer steps on, summed over
  // micro-batches (and, with data parallelism, over ranks).
  void add_expert_counts(std::vector<int64_t>& counts) const;
  // The expert chosen by each token in layer l in the last forward ([B·T] i32, E = skip).
  Tensor router_choice(int layer) const;

  // Wall time of each part of the step (blocks of the forward and the backward, the head and
  // loss, the embedding) since the last reset, when enabled (off by default: two clock reads per
  // part). Every op inside ends with its threads joined, so the parts add up to the step. The
  // GEMMs are inside the parts (ops::gemm_seconds() has them separately). In the order first
  // seen, which is the order of the step.
  struct SectionTime {
    std::string name;
    int64_t calls = 0;
    double seconds = 0.0;
    double gemm_seconds = 0.0;  // of `seconds`, the time inside ops::gemm / gemm_grouped
  };
  void time_sections(bool on) { time_sections_ = on; }
  const std::vector<SectionTime>& section_times() const { return sections_; }
  void reset_section_times() { sections_.clear(); }

  // Activation arena bytes (saved activations + backward scratch) for the current [B, T].
  size_t activation_bytes() const { return arena_.capacity(); }
  // Bytes of one layer's saved activations, per token (compare with
  // activation_bytes_per_token_per_layer(cfg, 4)): what each layer holds without recompute, and
  // what the one shared set holds with it.
  double saved_bytes_per_token_per_layer() const { return saved_per_layer_ / static_cast<double>(B_ * T_); }
  // Bytes each layer holds through the whole step, per token, besides its input x^l: its saved
  // activations without recompute; with it, only its router state and routing choice.
  double kept_bytes_per_token_per_layer() const { return kept_per_layer_ / static_cast<double>(B_ * T_); }

  // Read-only views for the cached decoder (generate.cc), which prefills with forward() and then
  // reads what it needs from the saved activations: layer l's parameter views, layer l's saved
  // activations of the last forward (not with recompute on: throws), layer l's input x^l [B·T, H]
  // (the residual stream, kept in every mode), and the final-normed hidden states [B·T, H].
  const LayerParams& layer_param_views(int l) const;
  const LayerActs& layer_acts(int l) const;
  const Tensor& layer_input(int l) const;
  const Tensor& final_hidden() const;

 private:
  void plan();
  // recomputing: the re-run in backward(), which leaves the saved input x^{l+1} and the host counts
  // as the forward left them.
  void layer_forward(int l, bool recomputing = false);
  void recompute_layer(int l);
  void layer_backward(int l);
  // The sequence ops of a layer under context parallelism (context_parallel.cc): conv, value shift,
  // q/k path and attention with their halo and K/V exchanges.
  void cp_attention_forward(int l);
  void cp_attention_backward(int l);
  void cp_gather_kv(int l);
  void cp_place_kv();                  // the gathered K/V (kg, vg) into sequence order (kfull, vfull)
  void cp_attention_overlapped(int l, Exchange& gather_k, Exchange& gather_v);  // forward's step 4
  void cp_attention_backward_overlapped(int l);
  void cp_attention_backward_blocking(int l);
  void cp_start_kv_gather(int l);      // backward's gather of layer l's K/V, issued ahead
  int64_t cp_chunk_start(int64_t seg) const;
  ops::ExpertWeights expert_weights(int l) const;  // the GEMM weights: f32, or their bf16 copies
  ops::ExpertActs expert_acts(int l) const;
  void router_backward(int l);
  void plan_backward_side_tasks(int l);
  void run_pending_weight_grads();
  static void run_router_backward(void* model, int64_t l);
  static void run_pending_weight_grad(void* model, int64_t j);
  void report_ready(int64_t begin, int64_t end) const;
  void report_ready_layer(int l) const;
  friend class SectionClock;

  ModelConfig cfg_;
  Device device_ = Device::cpu;
  int64_t B_ = 0, T_ = 0, S_ = 0;  // T_ tokens per row on this rank, S_ in the sequence
  ContextGroup* cp_ = nullptr;       // null or a group of one: no context parallelism
  CpSchedule cp_schedule_ = CpSchedule::overlapped;
  Exchange cp_kv_gather_[2];         // backward's K and V gathers in flight (overlapped schedule)
  int cp_kv_gather_layer_ = -1;      // the layer they gather
  std::vector<ParamSpec> specs_;
  std::map<std::string, int> index_;
  std::vector<int64_t> offsets_;  // element offset of each parameter in the flat buffers
  Tensor params_, grads_, beta_;
  std::vector<Tensor> param_views_, grad_views_;
  ops::RopeTable rope_;

  Arena arena_;
  std::vector<LayerActs> acts_;
  std::vector<LayerParams> lp_, lg_;  // parameter and gradient views per layer
  // Weight gradients dW += dyᵀ·x (Trans T, N; accumulating) left for later in the backward
  // (zaya_layer.cc, "Backward scheduling"): nothing downstream reads them, so they become side
  // tasks of the next layer's experts. Reused: reserved once, a step allocates nothing.
  std::vector<ops::GemmProblem> pending_wgrads_;
  std::vector<ops::SideTask> side_tasks_;
  std::vector<int32_t> counts_host_;  // [L, E] tokens per expert of the last forward, on the host
  std::vector<std::pair<int64_t, int64_t>> layer_ranges_;  // each layer's flat parameter range
  const GradReadyFn* ready_ = nullptr;  // the running backward's callback, or null
  ParamNeedFn param_need_;
  void need_params(int64_t begin, int64_t end) const {
    if (param_need_ && begin < end) param_need_(begin, end);
  }
  std::unique_ptr<ScratchActs> scratch_;
  size_t saved_per_layer_ = 0, kept_per_layer_ = 0;
  bool recompute_ = false;
  bool have_backward_ = false;
  DType gemm_dtype_ = DType::f32;
  DType activation_dtype_ = DType::f32;
  // bf16 weight copies for the bf16 GEMM path (empty in f32 mode): per-layer expert stacks, embedding.
  std::vector<Tensor> w_gu16_, w_d16_;
  Tensor emb16_;
  // bf16 copies of each layer's dense projection weights (bf16 GEMM path; refreshed every forward).
  struct DenseWeights16 {
    Tensor w_qkv, w_o, w_down, fc1w, fc2w, outw;
  };
  std::vector<DenseWeights16> dense16_;
  void cast_dense_weights(int l);
  // bf16 weight storage: the parameters f32 ops read, widened (small32_; small_views_[i] is
  // parameter i's f32 view, undefined for the GEMM weights). Each segment is a run of such
  // parameters adjacent in the flat buffer, widened by one cast.
  struct SmallSegment {
    int64_t begin, end, at;  // flat range [begin, end) of the bf16 buffer, its offset in small32_
  };
  Tensor small32_;
  std::vector<Tensor> small_views_;
  std::vector<SmallSegment> small_segments_;
  // The f32 view of parameter i for the ops that compute in f32: the parameter itself in f32
  // storage, its widened copy in bf16 storage (not for the GEMM weights).
  const Tensor& f32_param(int i) const;
  // need_params, then (bf16 storage) widens the small parameters of [begin, end): every forward
  // calls it before it first reads a range, so the widened copies follow each update and gather.
  void need_weights(int64_t begin, int64_t end);
  void widen_small(int64_t begin, int64_t end);  // small32_ ← the small parameters of [begin, end)
  Tensor f32_or_gemm_view(int i) const;          // a layer view: the bf16 GEMM weight or the f32 copy
  // Per-layer views of `flat` (the parameters or gradients), parameter i through view(i), the
  // fused q|k|v projection as one window of `flat`.
  std::vector<LayerParams> layer_views(const Tensor& flat, const std::function<Tensor(int)>& view) const;
  void make_gemm_weights();
  void clear_gemm_weights();
  // Layer l's dense-projection GEMM operands: weights and saved inputs, f32 or their bf16 copies.
  struct DenseGemms {
    Tensor w_qkv, w_o, w_down, fc1w, fc2w, outw;
    Tensor u, att, w, zr, g1, g2;
  };
  DenseGemms dense_gemms(int l) const;
  bool time_sections_ = false;
  std::vector<SectionTime> sections_;
};

}  // namespace zaya::model
