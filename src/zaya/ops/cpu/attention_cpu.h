// Raw-pointer CPU kernels behind zaya/ops/attention.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                   int64_t nq, int64_t nkv, int64_t hd);
void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                   const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t nq,
                   int64_t nkv, int64_t hd);
// The tiled kernels for queries at an offset q_pos (a multiple of attention_tiled_block) against
// keys [0, min(q_pos + Tq, key_end)) of Tk per row (attention_cpu.cc); attention_fwd/bwd are their
// q_pos = 0 case. key_end < 0 means q_pos + Tq (the causal chunk); key_end ≤ q_pos makes every key
// visible to every query (the keys before a chunk, attention_prefix_*). accumulate_q adds dq.
constexpr int64_t attention_tiled_block = 64;
void attention_tiled_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B,
                         int64_t Tq, int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd,
                         int64_t key_end = -1);
void attention_tiled_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                         const float* v, const float* out, const float* lse, int64_t B, int64_t Tq, int64_t Tk,
                         int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd, bool accumulate_kv,
                         int64_t key_end = -1, bool accumulate_q = false);
// attention_at_forward / attention_at_backward at any q_pos, row by row (cpu/attention_at_cpu.cc),
// with the same key_end and accumulate_q as the tiled kernels.
void attention_at_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t Tq,
                      int64_t Tk, int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd, int64_t key_end = -1);
void attention_at_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                      const float* v, const float* out, const float* lse, int64_t B, int64_t Tq, int64_t Tk,
                      int64_t q_pos, int64_t nq, int64_t nkv, int64_t hd, int64_t key_end = -1,
                      bool accumulate_q = false);
// (out_a, lse_a) ← the softmax merge of two partial attentions over disjoint key sets: out [R, nq, hd]
// rows, lse [B, nq, T] (R = B·T), as attention_forward lays them out.
void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t B, int64_t T,
                     int64_t nq, int64_t hd);
void attention_decode(float* out, const float* q, const float* kc, const float* vc, int64_t B, int64_t S_cap,
                      int64_t S, int64_t nq, int64_t nkv, int64_t hd);

}  // namespace zaya::ops::cpu
