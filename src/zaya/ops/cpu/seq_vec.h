// Small vector helpers for the sequence-op kernels. Without -ffast-math the compiler may not
// reorder a float reduction, so dot() keeps 16 independent partial sums (which it does vectorize)
// and adds them in a fixed order: the result depends only on n, never on threads or alignment.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2/3, Intel before Skylake-SP) get 8-lane forms
// of the AVX-512 kernels: the same IEEE operations in the same order per element, so the same bits.
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define ZAYA_AVX2 1
#endif

namespace zaya::ops::cpu {

// Allocator for 64-byte-aligned buffers (a cache line, one AVX-512 vector): std::vector's default
// storage is only 16-byte aligned, so every 64-byte load from a kernel's scratch row would straddle
// two cache lines.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
};
template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// Scratch of at least n floats that keeps its pages from call to call (one buffer per calling
// thread and slot). A fresh vector of 128 KiB or more per call is mmap'ed and unmapped each time
// (glibc) and page-faults in again on the next call. Contents are unspecified: callers write
// before they read. Slots in use: 0-5 the CCA conv, 6-7 the attention forward.
template <int Slot>
float* scratch(int64_t n) {
  thread_local AlignedVector<float> buf;
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// The fixed addition tree over 16 partial sums (lane l accumulated the terms i ≡ l mod 16) that
// dotf, sum_expf and exp_store_sum share: l += l+8, l += l+4, then (0 + 2) + (1 + 3). Results
// depend only on the inputs and their count, never on threads or vector width.
inline float sum16(float acc[16]) {
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

#if ZAYA_AVX2
// The first n of 8 lanes (n clamped to [0, 8]) as a maskload/maskstore mask.
inline __m256i first_lanes8(int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(n, 0, 8))), lane);
}
#endif

#if defined(__AVX512F__)
// The mask of the first n lanes (n clamped to [0, 16]).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1u);
}

// 128-bit quarters of a and b picked by Imm (_mm512_shuffle_f32x4), through the masked form with
// every lane selected: GCC 12's plain one passes an undefined vector and warns.
template <int Imm>
inline __m512 shuffle_quarters(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, Imm);
}

// sum16 on 16 lanes at once: lane o of the result is sum16 of p[l·ld + o], l = 0..15 (the 16
// partial sums of output o lie ld floats apart), with sum16's additions in sum16's order, so the
// same bits (tests/ops/test_dense.cc, Sum16LanesEqualsSum16): 15 vector adds for 16 outputs.
inline __m512 sum16_lanes(const float* p, int64_t ld) {
  auto P = [&](int l) { return _mm512_loadu_ps(p + l * ld); };
  __m512 s[8];
  for (int l = 0; l < 8; ++l) s[l] = _mm512_add_ps(P(l), P(l + 8));  // l += l+8
  for (int l = 0; l < 4; ++l) s[l] = _mm512_add_ps(s[l], s[l + 4]);  // l += l+4
  return _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
}

// dst[c·ldd + r] = src[r·lds + c] for r, c < 16: a 16×16 transpose in registers (4 rounds of
// unpack/shuffle, 64 shuffles for 256 elements instead of 256 scalar loads and strided stores).
inline void transpose16(float* dst, int64_t ldd, const float* src, int64_t lds) {
  // Masked forms with every lane selected, as in shuffle_quarters.
  auto lo32 = [](__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, 0xFFFF, a, b); };
  auto hi32 = [](__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, 0xFFFF, a, b); };
  auto lo64 = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_mask_unpacklo_pd(_mm512_castps_pd(a), 0xFF, _mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  auto hi64 = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_mask_unpackhi_pd(_mm512_castps_pd(a), 0xFF, _mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {  // pairs of rows: elements interleaved
    t[i] = lo32(r[i], r[i + 1]);
    t[i + 1] = hi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // quads: 64-bit pairs interleaved
    r[i] = lo64(t[i], t[i + 2]);
    r[i + 1] = hi64(t[i], t[i + 2]);
    r[i + 2] = lo64(t[i + 1], t[i + 3]);
    r[i + 3] = hi64(t[i + 1], t[i + 3]);
  }
  // Now r[4q + k] holds, in 128-bit lane L, column 4L + k of rows 4q..4q+3; two rounds of 128-bit
  // shuffles gather each column's four row-quads into one register.
  for (int i = 0; i < 4; ++i) {
    t[i] = shuffle_quarters<0x88>(r[i], r[i + 4]);
    t[i + 4] = shuffle_quarters<0xDD>(r[i], r[i + 4]);
    t[i + 8] = shuffle_quarters<0x88>(r[i + 8], r[i + 12]);
    t[i + 12] = shuffle_quarters<0xDD>(r[i + 8], r[i + 12]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = shuffle_quarters<0x88>(t[i], t[i + 8]);
    r[i + 8] = shuffle_quarters<0xDD>(t[i], t[i + 8]);
    r[i + 4] = shuffle_quarters<0x88>(t[i + 4], t[i + 12]);
    r[i + 12] = shuffle_quarters<0xDD>(t[i + 4], t[i + 12]);
  }
  for (int c = 0; c < 16; ++c) _mm512_storeu_ps(dst + c * ldd, r[c]);  // r[c]: column c
}
#endif

// 16 floats: one AVX-512 register, two AVX2 ones, or a plain array (the same IEEE operations
// lane by lane in every form). load and store take the count n of valid lanes: the rest read as zero and are not
// written.
struct VecF {
  static constexpr int64_t kLanes = 16;
#if defined(__AVX512F__)
  __m512 v;
  static VecF zero() { return {_mm512_setzero_ps()}; }
  static VecF load(const float* p, int64_t n) { return {_mm512_maskz_loadu_ps(first_lanes(n), p)}; }
  void store(float* p, int64_t n) const { _mm512_mask_storeu_ps(p, first_lanes(n), v); }
  friend VecF operator+(VecF a, VecF b) { return {_mm512_add_ps(a.v, b.v)}; }
  friend VecF operator*(VecF a, VecF b) { return {_mm512_mul_ps(a.v, b.v)}; }
  friend VecF fma(VecF a, VecF b, VecF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
#elif ZAYA_AVX2
  __m256 lo, hi;  // lanes 0-7 and 8-15
  static VecF zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static VecF load(const float* p, int64_t n) {
    if (n >= 16) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    return {_mm256_maskload_ps(p, first_lanes8(n)), _mm256_maskload_ps(p + 8, first_lanes8(n - 8))};
  }
  void store(float* p, int64_t n) const {
    if (n >= 16) {
      _mm256_storeu_ps(p, lo);
      _mm256_storeu_ps(p + 8, hi);
      return;
    }
    _mm256_maskstore_ps(p, first_lanes8(n), lo);
    _mm256_maskstore_ps(p + 8, first_lanes8(n - 8), hi);
  }
  friend VecF operator+(VecF a, VecF b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  friend VecF operator*(VecF a, VecF b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  friend VecF fma(VecF a, VecF b, VecF c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
#else
  float v[16];
  static VecF zero() { return {}; }
  static VecF load(const float* p, int64_t n) {
    VecF r{};
    for (int64_t l = 0; l < std::min<int64_t>(n, 16); ++l) r.v[l] = p[l];
    return r;
  }
  void store(float* p, int64_t n) const {
    for (int64_t l = 0; l < std::min<int64_t>(n, 16); ++l) p[l] = v[l];
  }
  friend VecF operator+(VecF a, VecF b) {
    for (int l = 0; l < 16; ++l) a.v[l] += b.v[l];
    return a;
  }
  friend VecF operator*(VecF a, VecF b) {
    for (int l = 0; l < 16; ++l) a.v[l] *= b.v[l];
    return a;
  }
  friend VecF fma(VecF a, VecF b, VecF c) {
    for (int l = 0; l < 16; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return c;
  }
#endif
};

inline float dotf(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return sum16(acc);
}

// exp(x), branch-free so loops over arrays vectorize (libm's expf is a scalar call: 1-3 GB/s):
// x = n·ln2 + r with |r| ≤ ln2/2, a degree-7 polynomial for e^r (Cephes' coefficients, ~1 ulp) and
// 2^n put into the exponent bits. x is clamped to [−87, 88] so 2^n stays a normal float: below
// −87 the result is ~1.6e-38 instead of 0 or a denormal, above 88 it saturates at ~1.65e38.
// The constants of expf_fast and of its vector forms, in one place: the forms give the same bits
// only while they share them. ln2 in two parts for the Cody–Waite reduction r = v − n·ln2, and
// P's coefficients from its highest power down (exp(r) ≈ 1 + r + r²·P(r)).
namespace exp_detail {
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_detail

inline float expf_fast(float x) {
  const float v = std::min(std::max(x, -87.0f), 88.0f);
  // Round v·log2(e) to the nearest integer by adding and subtracting 1.5·2^23.
  const float t = v * 1.44269504088896341f + 12582912.0f;
  const float nf = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;  // bits of 12582912.0f
  const float r = v - nf * exp_detail::kLn2Hi - nf * exp_detail::kLn2Lo;
  float p = exp_detail::kPoly[0];
  for (int i = 1; i < 6; ++i) p = p * r + exp_detail::kPoly[i];
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

#if defined(__AVX512F__)
// expf_fast's reduction and polynomial on 16 lanes: with n the nearest integer to v·log2(e),
// r = v − n·ln2 in two steps (Cody–Waite) and p = 1 + r + r²·P(r) ≈ exp(r); exp(v) = p·2^n.
inline __m512 expf_reduced_v(__m512 v, __m512 n) {
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_detail::kLn2Hi), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_detail::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(exp_detail::kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_detail::kPoly[i]));
  return _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
}

// expf_fast on 16 lanes, for kernels written with intrinsics: the same steps (clamp, round
// x·log2(e) by the 1.5·2^23 trick, Cody–Waite reduction, the same polynomial, 2^n into the exponent
// bits), with FMAs where the scalar form's `a * b + c` contracts to one.
inline __m512 expf_fast_v(__m512 x) {
  // Masked forms with every lane selected throughout: GCC 12's plain min/max/slli pass an undefined
  // vector and warn.
  const __m512 lo = _mm512_mask_max_ps(x, 0xFFFF, x, _mm512_set1_ps(-87.0f));
  const __m512 v = _mm512_mask_min_ps(lo, 0xFFFF, lo, _mm512_set1_ps(88.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), magic);
  const __m512 nf = _mm512_sub_ps(t, magic);
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000));
  const __m512 p = expf_reduced_v(v, nf);
  const __m512i biased = _mm512_add_epi32(ni, _mm512_set1_epi32(127));
  const __m512i e = _mm512_mask_slli_epi32(biased, 0xFFFF, biased, 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// exp(v) for v ≤ 0 on 16 lanes in fewer steps than expf_fast_v, for the softmax of scores minus
// their max: v floored at −104 (exp is 0 in f32 below −103.3; a NaN stays NaN: vmaxps returns its
// second operand when one is NaN), n = round(v·log2(e)) by roundscale, expf_fast's reduction and
// polynomial, and 2^n applied by scalef, which needs no clamp at the top (v ≤ 0) and gives 0 or a
// subnormal at the bottom (callers flush those). n comes from the rounded product v·log2(e) here and
// from the exact one (one FMA) in expf_fast_v, so at a rounding tie the two can pick neighbouring n
// and differ by an ulp; otherwise they agree for v ≥ −87 (SeqVec.ExpNonpositiveMatchesExpFastVector
// runs every 256th float of [−87, 0] and prints how many differ).
inline __m512 expf_nonpositive_v(__m512 v) {
  v = _mm512_mask_max_ps(v, 0xFFFF, _mm512_set1_ps(-104.0f), v);
  const __m512 n =
      _mm512_mask_roundscale_ps(v, 0xFFFF, _mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 p = expf_reduced_v(v, n);
  return _mm512_mask_scalef_ps(p, 0xFFFF, p, n);
}
#endif

#if ZAYA_AVX2
// expf_fast_v on 8 lanes: the same steps with the same FMAs.
inline __m256 expf_fast_v8(__m256 x) {
  const __m256 v = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 nf = _mm256_sub_ps(t, magic);
  const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000));
  __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(exp_detail::kLn2Hi), v);
  r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(exp_detail::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(exp_detail::kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_detail::kPoly[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// sum16 of 8 outputs at once: element o of the result is sum16(acc + 16·o) ([output][lane] in
// memory), with sum16's additions in sum16's order, so the same bits.
inline __m256 sum16_x8(const float* acc) {
  __m256 v[8], t[4];
  for (int o = 0; o < 8; ++o) v[o] = _mm256_add_ps(_mm256_loadu_ps(acc + 16 * o), _mm256_loadu_ps(acc + 16 * o + 8));
  for (int o = 0; o < 4; ++o)  // l += l+4: output o's 4 sums in the low 128 bits, output o+4's in the high
    t[o] = _mm256_add_ps(_mm256_permute2f128_ps(v[o], v[o + 4], 0x20), _mm256_permute2f128_ps(v[o], v[o + 4], 0x31));
  // [0+2, 1+3] of outputs o and o+1 side by side, then (0+2) + (1+3): element o (low half) and o+4.
  const __m256 ab = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xEE));
  const __m256 cd = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x88), _mm256_shuffle_ps(ab, cd, 0xDD));
}

// dst[c·ldd + r] = src[r·lds + c] for r, c < 8: an 8×8 transpose in registers (unpack, shuffle,
// then 128-bit lane permutes: 24 shuffles for 64 elements).
inline void transpose8(float* dst, int64_t ldd, const float* src, int64_t lds) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows, elements interleaved
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // quads: within each 128-bit lane, column 4L + k of rows i..i+3
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // the low lanes of rows 0-3 and 4-7 make column k, the high ones k + 4
    _mm256_storeu_ps(dst + k * ldd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * ldd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}
#endif

// erf(x) to within ~1 ulp, without libm (whose erff is a scalar call: ~1 GB/s in GELU).
// Piecewise polynomials: |x| in [0, 4) is cut into 8 intervals of width 1/2; interval k ≥ 1 holds a
// degree-7 polynomial in t = |x| − (k/2 + 1/4), interval 0 erf(x) = x + x·q(x²) with q of degree 7
// (so tiny arguments keep full relative accuracy); from |x| = 4 on erf rounds to 1 in float. One
// Horner evaluation per element whose coefficients are looked up by interval: in erf_fast_n that is
// a 16-lane AVX-512 permute per coefficient, ~25 instructions per 16 elements, a third of an
// exp-based erf's. The coefficients are our own near-minimax fits (relative-error Lawson-weighted
// least squares in double against math.erf) rounded to float; evaluated with FMAs in float they stay
// within 1.04 ulp of erf in double (the spacing of floats above |erf(x)|), measured over a dense grid
// of [−6, 6] (tests/ops/test_dense.cc, ErfFastWithinOneUlpOfDouble). Scalar and vector forms do the
// same IEEE operations in the same order, so they give the same bits (ErfFastVectorEqualsScalar).
inline constexpr float kErfCoef[8][8] = {  // [power][interval]
    {1.283791661e-01f, 7.111556530e-01f, 9.229001403e-01f, 9.866716862e-01f, 9.985373020e-01f, 9.998993874e-01f, 9.999957085e-01f, 9.999998808e-01f},
    {-3.761263788e-01f, 6.429311037e-01f, 2.365211248e-01f, 5.277499557e-02f, 7.142319344e-03f, 5.862773396e-04f, 2.918900100e-05f, 8.814262173e-07f},
    {1.128379181e-01f, -4.821981788e-01f, -2.956517339e-01f, -9.235620499e-02f, -1.607015729e-02f, -1.612267341e-03f, -9.486932686e-05f, -3.306070539e-06f},
    {-2.686616965e-02f, 2.678790689e-02f, 1.675360948e-01f, 9.015742689e-02f, 2.172449231e-02f, 2.760376548e-03f, 1.958139910e-04f, 7.970661500e-06f},
    {5.223962944e-03f, 1.506758928e-01f, -6.131991744e-03f, -4.810549319e-02f, -1.908825338e-02f, -3.257713048e-03f, -2.861695539e-04f, -1.378542675e-05f},
    {-8.547047037e-04f, -5.320279673e-02f, -4.719308019e-02f, 6.617152598e-03f, 1.066069771e-02f, 2.756412141e-03f, 3.135855077e-04f, 1.831937152e-05f},
    {1.199394610e-04f, -2.658564970e-02f, 2.059727535e-02f, 9.049176238e-03f, -2.779593226e-03f, -1.667822013e-03f, -2.737570030e-04f, -2.069223046e-05f},
    {-1.337826143e-05f, 1.775436103e-02f, 3.804829903e-03f, -5.920952652e-03f, -7.273622905e-04f, 6.347023300e-04f, 1.739928557e-04f, 1.724244066e-05f},
};
inline constexpr float kErfCenter[8] = {0.0f, 0.75f, 1.25f, 1.75f, 2.25f, 2.75f, 3.25f, 3.75f};

inline float erf_fast(float x) {
  const float ax = std::fabs(x);
  const int k = ax < 4.0f ? static_cast<int>(ax * 2.0f) : 7;  // NaN: 7 (and stays NaN)
  const float u = k == 0 ? ax * ax : ax - kErfCenter[k];
  float p = kErfCoef[7][k];
  for (int j = 6; j >= 0; --j) p = std::fma(p, u, kErfCoef[j][k]);
  float r = k == 0 ? std::fma(ax, p, ax) : p;
  if (ax >= 4.0f) r = 1.0f;
  return std::copysign(r, x);
}

// out[i] = erf_fast(in[i]) for i < n (in and out may be the same array): 16 lanes at a time where
// the CPU has AVX-512, with the very same operations as the scalar form.
#if defined(__AVX512F__)
// table[k] per lane (k in 0..7). The masked form with every lane selected: GCC 12's plain
// _mm512_permutexvar_ps passes an undefined vector and warns (-Wmaybe-uninitialized).
inline __m512 lookup8(__m512i k, __m512 table) { return _mm512_mask_permutexvar_ps(table, 0xFFFF, k, table); }
#endif

inline void erf_fast_n(const float* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 coef[8];
  for (int j = 0; j < 8; ++j) coef[j] = _mm512_maskz_loadu_ps(0x00FF, kErfCoef[j]);  // lanes 8-15: 0, unused
  const __m512 center = _mm512_maskz_loadu_ps(0x00FF, kErfCenter);
  const __m512 four = _mm512_set1_ps(4.0f), two = _mm512_set1_ps(2.0f), one = _mm512_set1_ps(1.0f);
  const __m512i seven = _mm512_set1_epi32(7), zero = _mm512_setzero_si512();
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    const __m512 ax = _mm512_abs_ps(x);
    const __mmask16 below4 = _mm512_cmp_ps_mask(ax, four, _CMP_LT_OQ);
    const __m512i k = _mm512_mask_cvttps_epi32(seven, below4, _mm512_mul_ps(ax, two));
    const __mmask16 first = _mm512_cmpeq_epi32_mask(k, zero);
    const __m512 u = _mm512_mask_mul_ps(_mm512_sub_ps(ax, lookup8(k, center)), first, ax, ax);
    __m512 p = lookup8(k, coef[7]);
    for (int j = 6; j >= 0; --j) p = _mm512_fmadd_ps(p, u, lookup8(k, coef[j]));
    __m512 r = _mm512_mask_fmadd_ps(p, first, ax, ax);  // lanes of interval 0: ax·p + ax
    r = _mm512_mask_mov_ps(one, below4, r);             // |x| ≥ 4 (and NaN) → 1 ...
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(ax, ax, _CMP_UNORD_Q), ax);  // ... except NaN
    const __m512i bits = _mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(_mm512_castps_si512(x), sign));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(bits));
  }
#elif ZAYA_AVX2
  // The same steps on 8 lanes; the 8-entry table lookups are one permutevar8x32 each.
  __m256 coef[8];
  for (int j = 0; j < 8; ++j) coef[j] = _mm256_loadu_ps(kErfCoef[j]);
  const __m256 center = _mm256_loadu_ps(kErfCenter);
  const __m256 four = _mm256_set1_ps(4.0f), two = _mm256_set1_ps(2.0f), one = _mm256_set1_ps(1.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(0x80000000u)));
  const __m256i seven = _mm256_set1_epi32(7), zero = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256 ax = _mm256_and_ps(x, abs_mask);
    const __m256 below4 = _mm256_cmp_ps(ax, four, _CMP_LT_OQ);
    const __m256i k = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(seven), _mm256_castsi256_ps(_mm256_cvttps_epi32(_mm256_mul_ps(ax, two))), below4));
    const __m256 first = _mm256_castsi256_ps(_mm256_cmpeq_epi32(k, zero));
    const __m256 u = _mm256_blendv_ps(_mm256_sub_ps(ax, _mm256_permutevar8x32_ps(center, k)), _mm256_mul_ps(ax, ax), first);
    __m256 p = _mm256_permutevar8x32_ps(coef[7], k);
    for (int j = 6; j >= 0; --j) p = _mm256_fmadd_ps(p, u, _mm256_permutevar8x32_ps(coef[j], k));
    __m256 r = _mm256_blendv_ps(p, _mm256_fmadd_ps(ax, p, ax), first);  // interval 0: ax·p + ax
    r = _mm256_blendv_ps(one, r, below4);                                  // |x| ≥ 4 (and NaN) → 1 ...
    r = _mm256_blendv_ps(r, ax, _mm256_cmp_ps(ax, ax, _CMP_UNORD_Q));      // ... except NaN
    _mm256_storeu_ps(out + i, _mm256_or_ps(r, _mm256_and_ps(x, sign)));
  }
#endif
  for (; i < n; ++i) out[i] = erf_fast(in[i]);
}

// max over x[0..n) (−inf for n = 0). Max is exact, so 16 lanes give the same result as one.
inline float maxf(const float* x, int64_t n) {
  float acc[16];
  std::fill_n(acc, 16, -INFINITY);
  int64_t i = 0;
#if ZAYA_AVX2
  // max(x, acc) keeps acc when either is NaN, as std::max(acc, x) does.
  __m256 lo = _mm256_loadu_ps(acc), hi = lo;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_max_ps(_mm256_loadu_ps(x + i), lo);
    hi = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), hi);
  }
  _mm256_storeu_ps(acc, lo);
  _mm256_storeu_ps(acc + 8, hi);
#endif
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] = std::max(acc[l], x[i + l]);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] = std::max(acc[l], x[i]);
  float m = acc[0];
  for (int l = 1; l < 16; ++l) m = std::max(m, acc[l]);
  return m;
}

// Σ exp(x[i] − shift) with 16 partial sums in a fixed order (like dotf), so it vectorizes and the
// result depends only on n.
inline float sum_expf(const float* x, int64_t n, float shift) {
  float acc[16] = {};
  int64_t i = 0;
#if ZAYA_AVX2
  {  // lanes 0-7 and 8-15 of each 16 in two registers: the same partial sums
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (; i + 16 <= n; i += 16) {
      lo = _mm256_add_ps(lo, expf_fast_v8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)));
      hi = _mm256_add_ps(hi, expf_fast_v8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), sh)));
    }
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
  }
#endif
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += expf_fast(x[i + l] - shift);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += expf_fast(x[i] - shift);
  return sum16(acc);
}

// e[i] = post(exp(x[i] − shift)) for i < n, returning Σ e[i] in sum_expf's order (16 partial sums,
// fixed tree). e may be x (in place). `next` (may be null): memory to prefetch, one cache line per
// 16 elements (softmax passes the next row, so its reads overlap this row's arithmetic). `post`: a
// per-value map applied before storing and summing (the loss flushes tiny probabilities with it).
struct Identity {
  float operator()(float v) const { return v; }
};
// Values below `tiny` become 0 (NaN stays NaN).
struct FlushBelow {
  float tiny;
  float operator()(float v) const { return v < tiny ? 0.0f : v; }
};
// The probability below which the softmax kernels (the loss and the fused head, attention) store
// exact 0 through FlushBelow: far below float's resolution of any sum such a term enters, and it
// keeps their products with values and gradients clear of subnormals, which x86 runs through
// microcode assists (docs/CONTRIBUTING.md, "Adding an op").
constexpr float kTinyProbability = 0x1p-100f;
#if defined(__AVX512F__)
inline __m512 apply_post(FlushBelow f, __m512 v) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(f.tiny), _CMP_NLT_UQ), v);
}
#endif
#if ZAYA_AVX2
inline __m256 apply_post(Identity, __m256 v) { return v; }
inline __m256 apply_post(FlushBelow f, __m256 v) {
  return _mm256_and_ps(v, _mm256_cmp_ps(v, _mm256_set1_ps(f.tiny), _CMP_NLT_UQ));
}
#endif
template <class Post = Identity>
inline float exp_store_sum(float* e, const float* x, int64_t n, float shift, const float* next = nullptr,
                           Post post = {}) {
  float acc[16] = {};
  int64_t i = 0;
#if ZAYA_AVX2
  if constexpr (std::is_same_v<Post, Identity> || std::is_same_v<Post, FlushBelow>) {
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (; i + 16 <= n; i += 16) {
      if (next) __builtin_prefetch(next + i);
      const __m256 e0 = apply_post(post, expf_fast_v8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)));
      const __m256 e1 = apply_post(post, expf_fast_v8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), sh)));
      _mm256_storeu_ps(e + i, e0);
      _mm256_storeu_ps(e + i + 8, e1);
      lo = _mm256_add_ps(lo, e0);
      hi = _mm256_add_ps(hi, e1);
    }
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
  }
#endif
  for (; i + 16 <= n; i += 16) {
    if (next) __builtin_prefetch(next + i);
    for (int l = 0; l < 16; ++l) acc[l] += (e[i + l] = post(expf_fast(x[i + l] - shift)));
  }
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += (e[i] = post(expf_fast(x[i] - shift)));
  return sum16(acc);
}

// y += a·x
inline void axpyf(float* __restrict y, float a, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace zaya::ops::cpu
