// Cached autoregressive generation for ZayaModel (DESIGN.md, "Decode state"): a prefill runs the
// full forward over the prompt and fills, per layer, the post-RoPE K/V cache [B, S_max, nkv, hd],
// the last two pre-conv columns of z = concat(q̃, k̃) and the previous token's vd; each decode step
// then runs one token per batch row through the same math, positions continuing from the cache
// length. A decode step's logits equal the full forward's logits at that position (fp32 rounding).
//
// Sampling (greedy, temperature, nucleus/top-p) draws from a counter-based Philox stream keyed by
// the seed, so a seed fixes the output on every machine and thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/gemm.h"
#include "zaya/ops/rope.h"

namespace zaya::model {

// Per-layer decode state.
struct LayerCache {
  Tensor k, v;     // post-RoPE keys and shifted values [B, S_max, nkv, hd]
  Tensor conv;     // last two pre-conv columns of z [B, 2, C], oldest first
  Tensor vd_prev;  // previous token's delayed value half [B, nkv·hd/2]
};

class ZayaDecoder {
 public:
  // Caches for `batch` rows of up to `max_len` positions (prompt + generated tokens). The model must
  // outlive the decoder; prefill() re-plans the model's arena for [batch, prompt length].
  ZayaDecoder(ZayaModel& model, int64_t batch, int64_t max_len);

  // Full forward over prompts ids [B, T0] i32 (T0 ≤ max_len); fills the caches and writes the logits
  // of the last prompt position into logits [B, V] f32.
  void prefill(const Tensor& ids, const Tensor& logits);
  // One token per row (ids [B] i32) at position length(); logits [B, V] f32.
  void step(const Tensor& ids, const Tensor& logits);

  int64_t length() const { return len_; }  // positions in the cache
  int64_t max_len() const { return S_; }
  int64_t batch() const { return B_; }
  const LayerCache& cache(int l) const { return caches_[static_cast<size_t>(l)]; }

 private:
  void layer_step(int l);

  ZayaModel& m_;
  int64_t B_, S_, len_ = 0;
  ops::RopeTable rope_;
  std::vector<LayerCache> caches_;
  // One-token temporaries (B rows each), reused by every layer.
  Tensor x_, u_, proj_, z_, qt_, kt_, vc_, vd_, conv_, qpre_, kpre_, q_, k_, v_, att_, o_, xmid_, rstd_, w_, r_,
      rprev_, zr_, a1_, g1_, a2_, g2_, rlogits_, probs_, choice_, weight_, counts_, offsets_, pos_, src_, xp_, gu_,
      act_, y_, mo_, hf_;
};

struct SamplingOptions {
  bool greedy = true;        // argmax (lowest id on a tie); temperature/top_p ignored
  double temperature = 1.0;  // > 0: logits / T before the softmax
  double top_p = 1.0;        // (0, 1]: sample from the smallest set of ids whose probability ≥ top_p
  uint64_t seed = 0;         // Philox key
  int64_t top_k = 0;         // > 0: sample from the k most probable ids only (before top_p); 0: all
};

// Picks the next id of one row from logits [V]. `draw` indexes the Philox stream: generate() uses
// step·B + row, so each draw is a pure function of (seed, step, row). `scratch` is reused.
int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& opt, uint64_t draw,
                     std::vector<float>& scratch, std::vector<int32_t>& order);

struct GenerateOptions {
  int64_t max_new = 32;
  int64_t eos_token_id = -1;  // stop a row after it emits this id (−1: never)
  SamplingOptions sampling;
};

// Wall time of a generate() call's two phases (`zaya generate --timing`, the decode calibration of
// docs/sizing.md): the prefill, and the decode steps with the host sampling between them (each
// step of B rows makes one token per row; the last sampled token needs no step).
struct GenerateStats {
  double prefill_s = 0, decode_s = 0;
  int64_t decode_steps = 0;
  // Called when the prefill has returned, before the first decode step: where a caller snapshots
  // its own counters (the CLI's CPU GEMM time) to split them between the two phases.
  std::function<void()> after_prefill;
};

// Generates up to max_new tokens for each of the B prompt rows (ids [B, T0] i32, equal lengths).
// Returns the new ids per row; a row ends with eos when it stopped there. Generation ends when
// every row has stopped or max_new tokens were produced. `stats`, when given, gets the timings.
std::vector<std::vector<int32_t>> generate(ZayaModel& model, const Tensor& prompt, const GenerateOptions& opt,
                                           GenerateStats* stats = nullptr);

}  // namespace zaya::model
