// The sequence ops of a ZAYA1 layer under context parallelism (context_parallel.h; the design and
// the choice of all-gather over ring passes are in docs/context-parallel.md).
//
// This rank's rows are laid out (b, seg, i): batch row b, segment seg (0: chunk rank, 1: chunk
// 2K−1−rank), token i < c. Call u = 2b + seg a "unit": c consecutive rows at global positions
// [p_seg, p_seg + c).
//
// Forward, per layer:
//   1. halo: every rank all-gathers the last two positions of each of its chunks (z's columns and
//      [vc | vd]); each unit takes the two positions before its start from whichever rank holds
//      them (zeros before the sequence: exactly the single-device padding). With chunks of one
//      token the two come from two different chunks; the gather covers that with no special case.
//   2. conv and value shift run unchanged on "ext" sequences [halo(2) | chunk(c)] per unit; the
//      outputs at the chunk's rows are the single-device ones, since each output reads only the
//      two positions before it.
//   3. mean skip, QK norm, RoPE per unit with the RoPE table read from row p_seg (global positions).
//   4. attention: all-gather the post-RoPE K and V (nkv·hd per token each), put them in sequence
//      order, and run each unit's queries causally against the keys [0, p_seg + c).
// Backward undoes it: the K and V are gathered again (saving them would keep the whole sequence's
// K/V per layer), each unit's attention backward adds into the full dK, dV, which a reduce-scatter
// returns to the ranks that own the keys; the ext conv and value-shift backward give each unit's
// halo gradient, which an all-gather hands to the rank whose tokens the halo was.
//
// That is CpSchedule::blocking. CpSchedule::overlapped (the default) splits step 4 at each unit's
// start: the unit against its own keys while the K/V gathers are in flight, then against the keys
// before it, merged by log-sum-exp; in backward the gather is issued when the layer's backward
// starts (ZayaModel::layer_backward) and the keys-before half's reduce-scatter runs under the
// own-keys half (docs/context-parallel.md, "Overlap").
#include "zaya/model/context_parallel.h"

#include <cstring>

#include "zaya/core/error.h"
#include "zaya/model/model_internal.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/copy.h"

namespace zaya::model {

int64_t zigzag_chunk_len(int64_t seq_len, int64_t cp) {
  if (cp < 1 || seq_len <= 0 || seq_len % (2 * cp) != 0)
    throw Error(str("parallel.cp = ", cp, " cannot split a sequence of ", seq_len,
                    " tokens: context parallelism ", "cuts each sequence into 2·cp = ", 2 * cp,
                    " equal chunks (zigzag), so the sequence length ", "must be a multiple of ", 2 * cp));
  return seq_len / (2 * cp);
}

namespace {
void check_rows_4byte(const char* what, const Tensor& t, int64_t B, int64_t T) {
  ZAYA_CHECK(t.device() == Device::cpu && dtype_size(t.dtype()) == 4 && t.numel() == B * T, what,
             ": expected ", B * T, " contiguous 4-byte host elements [", B, ", ", T, "], found ", t.str());
}

// Copies between whole rows [B, S] and one rank's zigzag part [B, 2c], in either direction.
void zigzag_copy(const char* what, const Tensor& rows, const Tensor& part, int64_t rank, int64_t cp, bool to_part) {
  ZAYA_CHECK(rows.ndim() == 2, what, ": rows must be [B, S], found ", rows.str());
  const int64_t B = rows.size(0), S = rows.size(1), c = zigzag_chunk_len(S, cp);
  ZAYA_CHECK(rank >= 0 && rank < cp, what, ": rank ", rank, " outside [0, ", cp, ")");
  check_rows_4byte(str(what, ": rows").c_str(), rows, B, S);
  check_rows_4byte(str(what, to_part ? ": out" : ": part").c_str(), part, B, 2 * c);
  auto* whole = static_cast<char*>(rows.raw());
  auto* mine = static_cast<char*>(part.raw());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t seg = 0; seg < 2; ++seg) {
      char* w = whole + 4 * (b * S + zigzag_chunk(rank, seg, cp) * c);
      char* m = mine + 4 * (b * 2 * c + seg * c);
      if (to_part)
        std::memcpy(m, w, static_cast<size_t>(4 * c));
      else
        std::memcpy(w, m, static_cast<size_t>(4 * c));
    }
}

// Device rows between rank-major order [K·N, F] (each rank's B rows of two chunks of c, as an
// all-gather leaves them and a reduce-scatter takes them) and sequence order [B·S, F], either way.
void zigzag_reorder(const Tensor& rank_major, const Tensor& sequence, int64_t K, int64_t B, int64_t S, int64_t c,
                    bool to_sequence) {
  const int64_t N = B * 2 * c, F = rank_major.size(1);
  for (int64_t r = 0; r < K; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t seg = 0; seg < 2; ++seg) {
        const int64_t g = r * N + (2 * b + seg) * c, q = b * S + zigzag_chunk(r, seg, K) * c;
        if (to_sequence)
          ops::copy_block(sequence, q, 0, rank_major, g, 0, c, F);
        else
          ops::copy_block(rank_major, g, 0, sequence, q, 0, c, F);
      }
}
}  // namespace

void zigzag_select(const Tensor& out, const Tensor& rows, int64_t rank, int64_t cp) {
  zigzag_copy("zigzag_select", rows, out, rank, cp, /*to_part=*/true);
}

void zigzag_place(const Tensor& rows, const Tensor& part, int64_t rank, int64_t cp) {
  zigzag_copy("zigzag_place", rows, part, rank, cp, /*to_part=*/false);
}

int64_t ZayaModel::cp_chunk_start(int64_t seg) const {
  return zigzag_chunk(cp_->rank(), seg, cp_->size()) * (T_ / 2);
}

// kfull, vfull [B·S, kv] ← the group's post-RoPE K and V of layer l, in sequence order.
void ZayaModel::cp_gather_kv(int l) {
  const LayerActs& t = acts_[static_cast<size_t>(l)];
  CpScratch& x = scratch_->cp;
  cp_->all_gather(x.kg, t.kr);
  cp_->all_gather(x.vg, t.v);
  cp_place_kv();
}

void ZayaModel::cp_place_kv() {
  CpScratch& x = scratch_->cp;
  zigzag_reorder(x.kg, x.kfull, cp_->size(), B_, S_, T_ / 2, /*to_sequence=*/true);
  zigzag_reorder(x.vg, x.vfull, cp_->size(), B_, S_, T_ / 2, /*to_sequence=*/true);
}

void ZayaModel::cp_attention_forward(int l) {
  const int64_t K = cp_->size(), c = T_ / 2, kv = cfg_.kv_dim(), C = cfg_.conv_channels();
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim, F = C + kv;
  const ops::CcaDims dims{nq, nkv, hd};
  LayerActs& t = acts_[static_cast<size_t>(l)];
  ScratchActs& s = *scratch_;
  CpScratch& x = s.cp;
  const LayerParams& p = lp_[static_cast<size_t>(l)];
  // 1. Halo: the last two positions of every chunk, gathered; then each unit's two predecessors.
  x.tails.zero_();  // a one-token chunk has no second-to-last position (never read)
  for (int64_t u = 0; u < 2 * B_; ++u)
    for (int64_t tr = 0; tr < 2; ++tr) {
      const int64_t i = c - 2 + tr;
      if (i < 0) continue;
      ops::copy_block(x.tails, 2 * u + tr, 0, t.z, u * c + i, 0, 1, C);
      ops::copy_block(x.tails, 2 * u + tr, C, s.vcd, u * c + i, 0, 1, kv);
    }
  cp_->all_gather(x.tails_all, x.tails);
  t.halo.zero_();  // positions before the sequence: the zero padding
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t seg = 0; seg < 2; ++seg) {
      const int64_t u = 2 * b + seg, start = cp_chunk_start(seg);
      for (int64_t hr = 0; hr < 2; ++hr) {
        const int64_t pos = start - 2 + hr;
        if (pos < 0) continue;
        const int64_t j = pos / c, tr = pos - ((j + 1) * c - 2);  // its row among chunk j's tails
        const int64_t src = zigzag_owner(j, K) * 4 * B_ + 2 * (2 * b + zigzag_segment(j, K)) + tr;
        ops::copy_block(t.halo, 2 * u + hr, 0, x.tails_all, src, 0, 1, F);
      }
    }
  // 2. Conv and value shift on [halo | chunk] per unit.
  for (int64_t u = 0; u < 2 * B_; ++u) {
    ops::copy_block(x.z_ext, u * (c + 2), 0, t.halo, 2 * u, 0, 2, C);
    ops::copy_block(x.z_ext, u * (c + 2) + 2, 0, t.z, u * c, 0, c, C);
    ops::copy_block(x.vcd_ext, u * (c + 2), 0, t.halo, 2 * u, C, 2, kv);
    ops::copy_block(x.vcd_ext, u * (c + 2) + 2, 0, s.vcd, u * c, 0, c, kv);
  }
  ops::cca_conv_forward(x.conv_ext, x.z_ext, p.conv, 2 * B_, c + 2, dims);
  ops::value_shift_forward(x.v_ext, x.vcd_ext, 2 * B_, c + 2, kv / 2);
  for (int64_t u = 0; u < 2 * B_; ++u) {
    ops::copy_block(s.conv, u * c, 0, x.conv_ext, u * (c + 2) + 2, 0, c, C);
    ops::copy_block(t.v, u * c, 0, x.v_ext, u * (c + 2) + 2, 0, c, kv);
  }
  // Overlapped: V is final here; its gather runs under the q/k path.
  Exchange gather_v;
  if (cp_schedule_ == CpSchedule::overlapped) gather_v = cp_->start_all_gather(x.vg, t.v);
  // 3. Mean skip → QK norm → RoPE per unit, at the unit's global positions.
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const int64_t start = cp_chunk_start(u % 2);
    const ops::RopeTable rope{rope_.cos.slice(start, start + c), rope_.sin.slice(start, start + c),
                              rope_.rot};
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::cca_qk_forward(rows(t.qr), rows(t.kr), rows(t.qpre), rows(t.kpre), rows(s.conv), rows(t.z), p.temp,
                        rope, 1, c, dims);
  }
  if (cp_schedule_ == CpSchedule::overlapped) {
    Exchange gather_k = cp_->start_all_gather(x.kg, t.kr);
    cp_attention_overlapped(l, gather_k, gather_v);
    return;
  }
  // 4. Attention against the gathered keys.
  cp_gather_kv(l);
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const int64_t b = u / 2, start = cp_chunk_start(u % 2), keys = start + c;
    ops::attention_at_forward(t.att.slice(u * c, (u + 1) * c), t.lse.slice(u, u + 1),
                              t.qr.slice(u * c, (u + 1) * c), x.kfull.slice(b * S_, b * S_ + keys),
                              x.vfull.slice(b * S_, b * S_ + keys), 1, c, keys, start, nq, nkv, hd);
  }
}

// Step 4 under CpSchedule::overlapped, with the K and V gathers in flight: each unit against its
// own keys (causal, at q_pos 0 of its own rows: no exchange needed), polling the gathers between
// units; then, once they complete, against the keys before the unit ([0, p_seg), every one
// visible), merged into the first half by log-sum-exp. The unit at position 0 has no keys before it.
void ZayaModel::cp_attention_overlapped(int l, Exchange& gather_k, Exchange& gather_v) {
  const int64_t c = T_ / 2, nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  LayerActs& t = acts_[static_cast<size_t>(l)];
  CpScratch& x = scratch_->cp;
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::attention_at_forward(rows(t.att), t.lse.slice(u, u + 1), rows(t.qr), rows(t.kr), rows(t.v), 1, c, c, 0, nq,
                              nkv, hd);
    gather_k.test();
    gather_v.test();
  }
  gather_k.wait();
  gather_v.wait();
  cp_place_kv();
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const int64_t b = u / 2, start = cp_chunk_start(u % 2);
    if (start == 0) continue;
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::attention_prefix_forward(rows(x.att_pre), x.lse_pre.slice(u, u + 1), rows(t.qr),
                                  x.kfull.slice(b * S_, b * S_ + start), x.vfull.slice(b * S_, b * S_ + start), 1, c,
                                  start, nq, nkv, hd);
    ops::attention_merge(rows(t.att), t.lse.slice(u, u + 1), rows(x.att_pre), x.lse_pre.slice(u, u + 1), 1, c, nq, hd);
  }
}

// Backward's K/V gather for layer l, issued when the layer's backward starts (t.kr and t.v are final
// then: saved, or just recomputed) so that it runs under the experts' and out projection's backward.
void ZayaModel::cp_start_kv_gather(int l) {
  const LayerActs& t = acts_[static_cast<size_t>(l)];
  CpScratch& x = scratch_->cp;
  cp_kv_gather_[0] = cp_->start_all_gather(x.kg, t.kr);
  cp_kv_gather_[1] = cp_->start_all_gather(x.vg, t.v);
  cp_kv_gather_layer_ = l;
}

// Attention's backward under CpSchedule::overlapped; the rest of cp_attention_backward is shared.
// The keys-before half first (its dK, dV belong to other ranks' keys, and to this rank's early
// chunk for its late one), so that their reduce-scatter runs while the own-keys half computes; the
// own keys' gradients are then added to what the reduce-scatter brought. dq accumulates both halves.
void ZayaModel::cp_attention_backward_overlapped(int l) {
  const int64_t K = cp_->size(), c = T_ / 2, N = B_ * T_, kv = cfg_.kv_dim();
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  LayerActs& t = acts_[static_cast<size_t>(l)];
  ScratchActs& s = *scratch_;
  CpScratch& x = s.cp;
  ZAYA_ASSERT(cp_kv_gather_layer_ == l);
  cp_kv_gather_[0].wait();
  cp_kv_gather_[1].wait();
  cp_kv_gather_layer_ = -1;
  cp_place_kv();
  s.dqr.zero_();
  x.dkfull.zero_();
  x.dvfull.zero_();
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const int64_t b = u / 2, start = cp_chunk_start(u % 2);
    if (start == 0) continue;
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::attention_prefix_backward(rows(s.dqr), x.dkfull.slice(b * S_, b * S_ + start),
                                   x.dvfull.slice(b * S_, b * S_ + start), rows(s.datt), rows(t.qr),
                                   x.kfull.slice(b * S_, b * S_ + start), x.vfull.slice(b * S_, b * S_ + start),
                                   rows(t.att), t.lse.slice(u, u + 1), 1, c, start, nq, nkv, hd);
  }
  zigzag_reorder(x.dkg, x.dkfull, K, B_, S_, c, /*to_sequence=*/false);
  zigzag_reorder(x.dvg, x.dvfull, K, B_, S_, c, /*to_sequence=*/false);
  Exchange scatter_k = cp_->start_reduce_scatter(s.dkr, x.dkg), scatter_v = cp_->start_reduce_scatter(s.dv, x.dvg);
  x.dk_own.zero_();
  x.dv_own.zero_();
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::attention_at_backward(rows(s.dqr), rows(x.dk_own), rows(x.dv_own), rows(s.datt), rows(t.qr), rows(t.kr),
                               rows(t.v), rows(t.att), t.lse.slice(u, u + 1), 1, c, c, 0, nq, nkv, hd,
                               /*accumulate_dq=*/true);
    scatter_k.test();
    scatter_v.test();
  }
  scatter_k.wait();
  scatter_v.wait();
  ops::add_block(s.dkr, 0, 0, x.dk_own, 0, 0, N, kv);
  ops::add_block(s.dv, 0, 0, x.dv_own, 0, 0, N, kv);
}

// Attention's backward under CpSchedule::blocking: every unit adds its keys' gradients into the
// full dK, dV; the owners get their sum.
void ZayaModel::cp_attention_backward_blocking(int l) {
  const int64_t K = cp_->size(), c = T_ / 2;
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  LayerActs& t = acts_[static_cast<size_t>(l)];
  ScratchActs& s = *scratch_;
  CpScratch& x = s.cp;
  cp_gather_kv(l);
  x.dkfull.zero_();
  x.dvfull.zero_();
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const int64_t b = u / 2, start = cp_chunk_start(u % 2), keys = start + c;
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::attention_at_backward(rows(s.dqr), x.dkfull.slice(b * S_, b * S_ + keys),
                               x.dvfull.slice(b * S_, b * S_ + keys), rows(s.datt), rows(t.qr),
                               x.kfull.slice(b * S_, b * S_ + keys), x.vfull.slice(b * S_, b * S_ + keys),
                               rows(t.att), t.lse.slice(u, u + 1), 1, c, keys, start, nq, nkv, hd);
  }
  zigzag_reorder(x.dkg, x.dkfull, K, B_, S_, c, /*to_sequence=*/false);
  zigzag_reorder(x.dvg, x.dvfull, K, B_, S_, c, /*to_sequence=*/false);
  cp_->reduce_scatter(s.dkr, x.dkg);
  cp_->reduce_scatter(s.dv, x.dvg);
}

// In: s.datt. Out: s.dz (mean skip + conv, halo gradients from the next chunks' owners included),
// s.dvcd, and the layer's temperature and conv weight gradients (this rank's part).
void ZayaModel::cp_attention_backward(int l) {
  const int64_t K = cp_->size(), c = T_ / 2, kv = cfg_.kv_dim(), C = cfg_.conv_channels();
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const ops::CcaDims dims{nq, nkv, hd};
  LayerActs& t = acts_[static_cast<size_t>(l)];
  ScratchActs& s = *scratch_;
  CpScratch& x = s.cp;
  const LayerParams& p = lp_[static_cast<size_t>(l)];
  LayerParams& g = lg_[static_cast<size_t>(l)];
  if (cp_schedule_ == CpSchedule::overlapped) {
    cp_attention_backward_overlapped(l);
  } else {
    cp_attention_backward_blocking(l);
  }
  // RoPE, QK norm, mean skip per unit: dconv, and dz's mean-skip part.
  for (int64_t u = 0; u < 2 * B_; ++u) {
    const int64_t start = cp_chunk_start(u % 2);
    const ops::RopeTable rope{rope_.cos.slice(start, start + c), rope_.sin.slice(start, start + c),
                              rope_.rot};
    const auto rows = [&](const Tensor& a) { return a.slice(u * c, (u + 1) * c); };
    ops::cca_qk_backward(rows(s.dconv), rows(s.dz), g.temp, rows(s.dqr), rows(s.dkr), rows(t.qpre),
                         rows(t.kpre), p.temp, rope, 1, c, dims);
  }
  // Conv and value shift on the ext sequences. The halo rows' outputs are not this unit's (their
  // gradient is 0); the halo rows' input gradients belong to the ranks that own those positions.
  x.conv_ext.zero_();  // holds dconv here
  x.v_ext.zero_();     // holds dv
  for (int64_t u = 0; u < 2 * B_; ++u) {
    ops::copy_block(x.z_ext, u * (c + 2), 0, t.halo, 2 * u, 0, 2, C);
    ops::copy_block(x.z_ext, u * (c + 2) + 2, 0, t.z, u * c, 0, c, C);
    ops::copy_block(x.conv_ext, u * (c + 2) + 2, 0, s.dconv, u * c, 0, c, C);
    ops::copy_block(x.v_ext, u * (c + 2) + 2, 0, s.dv, u * c, 0, c, kv);
  }
  ops::cca_conv_backward(x.dz_ext, g.conv, x.conv_ext, x.z_ext, p.conv, 2 * B_, c + 2, dims);
  ops::value_shift_backward(x.vcd_ext, x.v_ext, 2 * B_, c + 2, kv / 2);  // vcd_ext holds d[vc | vd]
  for (int64_t u = 0; u < 2 * B_; ++u) {
    ops::add_block(s.dz, u * c, 0, x.dz_ext, u * (c + 2) + 2, 0, c, C);
    ops::copy_block(s.dvcd, u * c, 0, x.vcd_ext, u * (c + 2) + 2, 0, c, kv);
    ops::copy_block(x.hgrad, 2 * u, 0, x.dz_ext, u * (c + 2), 0, 2, C);
    ops::copy_block(x.hgrad, 2 * u, C, x.vcd_ext, u * (c + 2), 0, 2, kv);
  }
  // Halo gradients home: chunk j's last position was halo row 1 of chunk j+1 (and, with one-token
  // chunks, row 0 of chunk j+2); its second-to-last was row 0 of chunk j+1. Added in that order.
  cp_->all_gather(x.hgrad_all, x.hgrad);
  const auto add_from = [&](int64_t b, int64_t u, int64_t i, int64_t j, int64_t hr) {
    if (j >= 2 * K) return;
    const int64_t src = zigzag_owner(j, K) * 4 * B_ + 2 * (2 * b + zigzag_segment(j, K)) + hr;
    ops::add_block(s.dz, u * c + i, 0, x.hgrad_all, src, 0, 1, C);
    ops::add_block(s.dvcd, u * c + i, 0, x.hgrad_all, src, C, 1, kv);
  };
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t seg = 0; seg < 2; ++seg) {
      const int64_t u = 2 * b + seg, j = zigzag_chunk(cp_->rank(), seg, K);
      add_from(b, u, c - 1, j + 1, 1);
      if (c == 1)
        add_from(b, u, 0, j + 2, 0);
      else
        add_from(b, u, c - 2, j + 1, 0);
    }
}

}  // namespace zaya::model
