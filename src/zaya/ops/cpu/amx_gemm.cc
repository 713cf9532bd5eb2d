// AMX bf16 GEMM kernel and its operand packing (see amx_gemm.h for the layouts and the math).
//
// Functions carry their own target attributes, so the file compiles on any x86-64 build machine;
// amx_usable() keeps them from running where the CPU lacks the units.
#include "zaya/ops/cpu/amx_gemm.h"

// GCC 12's AVX-512 headers fill "undefined" operands with a self-initialized variable, which
// -Wuninitialized reports once inlined into functions with their own target attribute.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <omp.h>

namespace zaya::ops::cpu {
namespace {

#define ZAYA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define ZAYA_AMX __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-bf16")))

constexpr int64_t kTileK = 32;      // bf16 k per A tile row / B tile (16 rows of pairs)
constexpr int64_t kTileN = 16;      // f32 columns per C tile
constexpr int64_t kTileElems = 512; // bf16 elements of one packed B tile (16 × 32)

bool cpu_has_amx_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;  // no leaf 7: no AVX-512, no AMX
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, avx512bw = (b >> 30) & 1;
  return amx_bf16 && amx_tile && avx512bw;
}

// Linux keeps the 8 KiB tile state off until a process asks for it (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); without it the first tile instruction faults.
bool request_tile_state() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Row r's 16 bf16 from column c (fewer at the edge: masked, zeros beyond), as 16 × 16 bits.
ZAYA_AVX512 inline __m256i load16(const bf16* row, int64_t c, int64_t cols) {
  const int64_t left = std::clamp<int64_t>(cols - c, 0, 16);
  return _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << left) - 1u), row + c);
}

// (a[i], b[i]) pairs for i = 0..15, as 16 × 32 bits: the k-pair layout of a B tile row.
ZAYA_AVX512 inline __m512i interleave16(__m256i a, __m256i b) {
  // Index i < 32 picks element i of the first operand, 32 + i element i of the second; only the
  // low 16 of each are used, so their upper halves may be anything.
  const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  return _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b));
}

// In-place transpose of a 16 × 16 matrix M of 32-bit elements held one row per register, in four
// rounds: 32- and 64-bit unpacks transpose every 4 × 4 sub-block within its 128-bit lanes, then two
// rounds of 128-bit lane shuffles move the sub-blocks to their transposed places.
ZAYA_AVX512 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Now lane L of r[4q + j] holds column 4L + j of rows 4q .. 4q + 3.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// r[kk] = rows k0 + 2kk and k0 + 2kk + 1 of X [K, N] (zero past K), columns n0..n0+15,
// interleaved as 32-bit pairs: for X = B that is the packed tile's row kk; for X = dy it is, per
// channel, the (k, k + 1) pairs that a 32-bit transpose turns into rows of dyᵀ.
ZAYA_AVX512 inline void interleaved_row_pairs(__m512i r[16], const bf16* X, int64_t ld, int64_t K, int64_t N,
                                              int64_t k0, int64_t n0) {
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t kk = 0; kk < 16; ++kk) {
    const int64_t r0 = k0 + 2 * kk, r1 = r0 + 1;
    r[kk] = interleave16(r0 < K ? load16(X + r0 * ld, n0, N) : zero, r1 < K ? load16(X + r1 * ld, n0, N) : zero);
  }
}

// One packed B tile (column block nb, k block kb) of op(X) = X [K, N]: row kk interleaves X's
// rows k0 + 2kk and k0 + 2kk + 1.
ZAYA_AVX512 void pack_tile_rows(bf16* out, const bf16* X, int64_t ld, int64_t K, int64_t N, int64_t k0, int64_t n0) {
  __m512i r[16];
  interleaved_row_pairs(r, X, ld, K, N, k0, n0);
  for (int64_t kk = 0; kk < 16; ++kk) _mm512_storeu_si512(out + kk * 32, r[kk]);
}

// The same tile of op(X) = Xᵀ, X [N, K]: X row n0 + n, read as 16 k-pairs (32 bits each), is
// column n of the tile, so the tile is the 32-bit transpose of 16 row segments.
ZAYA_AVX512 void pack_tile_transposed(bf16* out, const bf16* X, int64_t ld, int64_t K, int64_t N, int64_t k0,
                                      int64_t n0) {
  __m512i r[16];
  const int64_t left = std::clamp<int64_t>(K - k0, 0, 32);
  const __mmask32 mk = left == 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1u);
  for (int64_t n = 0; n < 16; ++n)
    r[n] = n0 + n < N ? _mm512_maskz_loadu_epi16(mk, X + (n0 + n) * ld + k0) : _mm512_setzero_si512();
  transpose16(r);
  for (int64_t kk = 0; kk < 16; ++kk) _mm512_storeu_si512(out + kk * 32, r[kk]);
}

// Rows i0..i0+15 of Xᵀ for X [K, M], k from k0 to k0+31 (zero past K), into At (ld_out): the
// interleaved row pairs transposed, so each channel's pairs become one row.
ZAYA_AVX512 void transpose_block(bf16* At, int64_t ld_out, const bf16* X, int64_t ld, int64_t K, int64_t M,
                                 int64_t k0, int64_t i0) {
  __m512i r[16];
  interleaved_row_pairs(r, X, ld, K, M, k0, i0);
  transpose16(r);
  const int64_t rows = std::min<int64_t>(16, M - i0);
  for (int64_t i = 0; i < rows; ++i) _mm512_storeu_si512(At + (i0 + i) * ld_out + k0, r[i]);
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// C tiles 0..3 = [rows m0, m0+16] × [cols n0, n0+16]; A tiles 4, 5; B tiles 6, 7. TwoN = false
// for a last column block of only 16 columns (tiles 1, 3 and 7 unused).
template <bool TwoN>
ZAYA_AMX void block32(float* C, int64_t ldc, const bf16* A, int64_t lda, const bf16* B0, const bf16* B1, int64_t kblocks,
                      bool accumulate, const bf16* next_b) {
  const int64_t sc = ldc * 4, sa = lda * 2;
  // Ask for C's lines for writing now: a tile store that misses waits for each line's read, and
  // with K = 256 a block's products take about as long as fetching its C.
  if (!accumulate)
    for (int64_t r = 0; r < 32; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc), _MM_HINT_ET0);
      if constexpr (TwoN) _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc + 16), _MM_HINT_ET0);
    }
  if (accumulate) {
    _tile_loadd(0, C, sc);
    _tile_loadd(2, C + 16 * ldc, sc);
    if constexpr (TwoN) {
      _tile_loadd(1, C + 16, sc);
      _tile_loadd(3, C + 16 * ldc + 16, sc);
    }
  } else {
    _tile_zero(0);
    _tile_zero(2);
    if constexpr (TwoN) {
      _tile_zero(1);
      _tile_zero(3);
    }
  }
  // Each load sits right before the first product that needs it, so loads overlap the products
  // in flight (all loads first, then the four products, ran several times slower here).
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    // The next task's B tiles (two per k block, contiguous) into L1 while this one computes:
    // they come from L2, and a tile load that waits on L2 stalls the product behind it.
    for (int64_t line = 0; line < 32; ++line)
      _mm_prefetch(reinterpret_cast<const char*>(next_b + 2 * kb * kTileElems) + 64 * line, _MM_HINT_T0);
    _tile_loadd(4, A + kb * kTileK, sa);
    _tile_loadd(6, B0 + kb * kTileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TwoN) {
      _tile_loadd(7, B1 + kb * kTileElems, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    _tile_loadd(5, A + 16 * lda + kb * kTileK, sa);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (TwoN) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, sc);
  _tile_stored(2, C + 16 * ldc, sc);
  if constexpr (TwoN) {
    _tile_stored(1, C + 16, sc);
    _tile_stored(3, C + 16 * ldc + 16, sc);
  }
}

// This thread's share [begin, end) of n items, contiguous (outside a parallel region, or whole:
// all of them).
struct Range {
  int64_t begin, end;
};
Range my_share(int64_t n, bool whole) {
  if (whole) return {0, n};
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  return {n * t / nt, n * (t + 1) / nt};
}

// Per-thread scratch for a last block of fewer than 32 rows (A rows zero-padded, and its C).
struct TailScratch {
  std::vector<bf16> a;
  float c[32 * 32];
};

}  // namespace

bool amx_usable() {
  static const bool ok = cpu_has_amx_bf16() && request_tile_state();
  return ok;
}

int64_t amx_packed_b_elems(int64_t K, int64_t N) {
  return (K + kTileK - 1) / kTileK * ((N + kTileN - 1) / kTileN) * kTileElems;
}

// Layout: tile (nb, kb) at (nb·KB + kb)·512, so a column block's k run is contiguous. Threads
// split the column pairs as amx_gemm does when it splits columns, so each thread's product reads
// the B it packed, from its own L2.
void amx_pack_b(bf16* out, const bf16* X, int64_t ld, int64_t K, int64_t N, bool transposed, bool whole) {
  const int64_t KB = (K + kTileK - 1) / kTileK, NB = (N + kTileN - 1) / kTileN;
  const Range pairs = my_share((NB + 1) / 2, whole);
  for (int64_t nb = 2 * pairs.begin; nb < std::min(NB, 2 * pairs.end); ++nb)
    for (int64_t kb = 0; kb < KB; ++kb) {
      bf16* tile = out + (nb * KB + kb) * kTileElems;
      if (transposed)
        pack_tile_transposed(tile, X, ld, K, N, kb * kTileK, nb * kTileN);
      else
        pack_tile_rows(tile, X, ld, K, N, kb * kTileK, nb * kTileN);
    }
}

void amx_transpose_a(bf16* out, const bf16* X, int64_t ld, int64_t K, int64_t M, bool whole) {
  const int64_t KB = (K + kTileK - 1) / kTileK, Kp = KB * kTileK;
  const Range mbs = my_share((M + 15) / 16, whole);
  for (int64_t mb = mbs.begin; mb < mbs.end; ++mb)
    for (int64_t kb = 0; kb < KB; ++kb) transpose_block(out, Kp, X, ld, K, M, kb * kTileK, mb * 16);
}

// A static config: GCC 12 treats the stores into a local one as dead (ldtilecfg reads memory it
// does not model) and loads garbage.
constexpr TileConfig make_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}
alignas(64) constexpr TileConfig kTileConfig = make_tile_config();

ZAYA_AMX void amx_tile_begin() { _tile_loadconfig(&kTileConfig); }

ZAYA_AMX void amx_tile_end() { _tile_release(); }

// Work is (row block of 32) × (column pair of 2 × 16). With enough column pairs each thread takes
// a contiguous range of them (the B it packed) for every row block; otherwise a range of row
// blocks. Either way a thread walks its column pairs inside each row block, so that block's A
// (32 × Kp bf16) stays in L1 while B comes from L2 (prefetched one pair ahead).
void amx_gemm(float* C, int64_t ldc, const bf16* A, int64_t lda, const bf16* Bp, int64_t M, int64_t N,
              int64_t Kp, bool accumulate, bool whole) {
  const int64_t KB = Kp / kTileK, NB = N / kTileN, pairs = (NB + 1) / 2, full = M / 32 * 32;
  const int64_t mblocks = (M + 31) / 32;
  const bool split_columns = whole || pairs >= 2 * omp_get_num_threads();
  const Range pr = split_columns ? my_share(pairs, whole) : Range{0, pairs};
  const Range mr = split_columns ? Range{0, mblocks} : my_share(mblocks, whole);
  thread_local TailScratch s;
  for (int64_t mb = mr.begin; mb < mr.end; ++mb) {
    const int64_t m0 = mb * 32;
    if (m0 >= full) {  // the last rows go through zero-padded scratch: rows of C are independent
      if (s.a.size() < static_cast<size_t>(32 * Kp)) s.a.resize(static_cast<size_t>(32 * Kp));
      for (int64_t r = 0; r < 32; ++r) {
        bf16* dst = s.a.data() + r * Kp;
        if (m0 + r < M)
          std::memcpy(dst, A + (m0 + r) * lda, static_cast<size_t>(Kp) * sizeof(bf16));
        else
          std::fill_n(dst, Kp, bf16{});
      }
    }
    for (int64_t p = pr.begin; p < pr.end; ++p) {
      const int64_t nb = 2 * p, n0 = nb * kTileN;
      const bool two = nb + 1 < NB;
      const bf16* B0 = Bp + nb * KB * kTileElems;
      const bf16* B1 = two ? B0 + KB * kTileElems : B0;
      // The next column pair's two tile runs (contiguous, 2·KB tiles), back to the first pair
      // of the range at its end; a 16-column last pair has only one run, so then the first.
      const int64_t np = p + 1 < pr.end ? p + 1 : pr.begin;
      const bf16* next_b = 2 * np + 1 < NB ? Bp + 2 * np * KB * kTileElems : Bp + 2 * pr.begin * KB * kTileElems;
      if (m0 < full) {
        if (two)
          block32<true>(C + m0 * ldc + n0, ldc, A + m0 * lda, lda, B0, B1, KB, accumulate, next_b);
        else
          block32<false>(C + m0 * ldc + n0, ldc, A + m0 * lda, lda, B0, B1, KB, accumulate, next_b);
        continue;
      }
      const int64_t rows = M - m0, cols = two ? 32 : 16;
      if (accumulate)
        for (int64_t r = 0; r < rows; ++r) std::memcpy(s.c + r * 32, C + (m0 + r) * ldc + n0, cols * sizeof(float));
      if (two)
        block32<true>(s.c, 32, s.a.data(), Kp, B0, B1, KB, accumulate, next_b);
      else
        block32<false>(s.c, 32, s.a.data(), Kp, B0, B1, KB, accumulate, next_b);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(C + (m0 + r) * ldc + n0, s.c + r * 32, cols * sizeof(float));
    }
  }
}

}  // namespace zaya::ops::cpu
