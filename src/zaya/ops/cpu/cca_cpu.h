// Raw-pointer CPU kernels behind zaya/ops/cca.h (arguments already checked there).
#pragma once

#include <cstdint>

namespace zaya::ops::cpu {

void cca_conv_fwd(float* out, const float* z, const float* dw, const float* db, const float* gw,
                  const float* gb, int64_t B, int64_t T, int64_t heads, int64_t hd);
void cca_conv_bwd(float* dz, float* ddw, float* ddb, float* dgw, float* dgb, const float* dout,
                  const float* z, const float* dw, const float* db, const float* gw, int64_t B, int64_t T,
                  int64_t heads, int64_t hd, bool accumulate_dz);
void cca_conv_decode(float* out, float* state, const float* z, const float* dw, const float* db,
                     const float* gw, const float* gb, int64_t B, int64_t heads, int64_t hd);

void mean_skip_fwd(float* q, float* k, const float* conv, const float* qt, const float* kt, int64_t N,
                   int64_t nq, int64_t nkv, int64_t hd);
void mean_skip_bwd(float* dconv, float* dqt, float* dkt, const float* dq, const float* dk, int64_t N,
                   int64_t nq, int64_t nkv, int64_t hd);

void value_shift_fwd(float* v, const float* vcd, int64_t B, int64_t T, int64_t half);
void value_shift_bwd(float* dvcd, const float* dv, int64_t B, int64_t T, int64_t half);
void value_shift_decode(float* v, float* state, const float* vc, const float* vd, int64_t B, int64_t half);

void qk_norm_fwd(float* qo, float* ko, const float* q, const float* k, const float* temp, int64_t N,
                 int64_t nq, int64_t nkv, int64_t hd);
void qk_norm_bwd(float* dq, float* dk, float* dtemp, const float* dqo, const float* dko, const float* q,
                 const float* k, const float* temp, int64_t N, int64_t nq, int64_t nkv, int64_t hd);

// mean skip → QK norm → RoPE per token (zaya/ops/cca.h, cca_qk_forward); z [N, C] = [q̃ | k̃] per
// row; cos/sin [positions, rot/2].
void cca_qk_fwd(float* qr, float* kr, float* qpre, float* kpre, const float* conv, const float* z, const float* temp,
                const float* cos, const float* sin, int64_t rot, int64_t B, int64_t T, int64_t nq, int64_t nkv,
                int64_t hd);
void cca_qk_bwd(float* dconv, float* dz, float* dtemp, const float* dqr, const float* dkr, const float* qpre,
                const float* kpre, const float* temp, const float* cos, const float* sin, int64_t rot, int64_t B,
                int64_t T, int64_t nq, int64_t nkv, int64_t hd);
}  // namespace zaya::ops::cpu
