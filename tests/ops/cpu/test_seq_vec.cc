// The CPU's vector math (ops/cpu/seq_vec.h) that the dense, attention, CCA and loss kernels share:
// erf and exp approximations against double, and the vector forms bitwise equal to the scalar ones
// they stand for.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zaya/ops/cpu/seq_vec.h"

namespace zaya::ops {
namespace {

// GELU's erf is cpu::erf_fast (a vectorizable polynomial fit, seq_vec.h), not libm's erff. Over a
// dense grid of [−6, 6] (step 2⁻¹⁸, 3.1 M points, both pieces and the switch between them at
// 0.921875, and the saturation to 1), it must stay within 1.25 ulp of erf in double, the ulp being
// the spacing of floats just above |erf(x)| (the smaller one at a power of two, so the stricter
// choice). Measured when it was written: 1.08 ulp, max |error| 6.4e-8, both near |x| = 1.056.
TEST(Activations, ErfFastWithinOneUlpOfDouble) {
  double worst_ulps = 0, worst_x = 0;
  for (int64_t i = -(int64_t{6} << 18); i <= (int64_t{6} << 18); ++i) {
    const float x = std::ldexp(static_cast<float>(i), -18);
    const double ref = std::erf(static_cast<double>(x));
    const float r = static_cast<float>(std::fabs(ref));
    const double ulp = std::nextafter(r, 2.0f) - r;
    const double ulps = std::fabs(cpu::erf_fast(x) - ref) / ulp;
    if (ulps > worst_ulps) worst_ulps = ulps, worst_x = x;
  }
  EXPECT_LE(worst_ulps, 1.25) << "at x = " << worst_x;
  // Tiny arguments (erf(x) ≈ 2x/√π), the tails, and the special values.
  for (float x : {1e-30f, -3e-20f, 1e-8f, 4.5f, -9.0f, 1e30f}) {
    const double ref = std::erf(static_cast<double>(x));
    EXPECT_NEAR(cpu::erf_fast(x), ref,
                1.25 * (std::nextafter(std::fabs(static_cast<float>(ref)), 2.0f) -
                        std::fabs(static_cast<float>(ref))))
        << "x = " << x;
  }
  EXPECT_EQ(cpu::erf_fast(INFINITY), 1.0f);
  EXPECT_EQ(cpu::erf_fast(-INFINITY), -1.0f);
  EXPECT_EQ(cpu::erf_fast(0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::erf_fast(NAN)));
}

// erf_fast_n (16 AVX-512 lanes where the CPU has them) must give erf_fast's bits for every input:
// a grid over [−6, 6] plus the specials, at a length that leaves a scalar tail.
TEST(Activations, ErfFastVectorEqualsScalar) {
  std::vector<float> x;
  for (int64_t i = -(int64_t{6} << 14); i <= (int64_t{6} << 14); ++i)
    x.push_back(std::ldexp(static_cast<float>(i), -14));
  for (float v :
       {0.0f, -0.0f, 1e-30f, -1e-30f, 3.999999f, 4.0f, -4.0f, 0.5f, -0.5f, 1e30f, INFINITY, -INFINITY})
    x.push_back(v);
  x.push_back(0.25f);  // odd length
  std::vector<float> y(x.size());
  cpu::erf_fast_n(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float s = cpu::erf_fast(x[i]);
    ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(s)) << "x = " << x[i];
  }
  float nan_in = NAN, nan_out = 0.0f;
  std::vector<float> nans(17, NAN), out(17);
  cpu::erf_fast_n(nans.data(), out.data(), 17);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  cpu::erf_fast_n(&nan_in, &nan_out, 1);
  EXPECT_TRUE(std::isnan(nan_out));
}

#if defined(__AVX512F__)
TEST(SeqVec, Sum16LanesEqualsSum16) {
  // The CCA conv forward adds 16 outputs' partial sums at once; the decode step (and the HF
  // parity of the key temperature's gradient) rely on its bits being sum16's. Values spread over
  // 12 binades so that the additions round differently in any other order; partials 20 floats
  // apart, as a row stride other than 16 would be.
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-6, 6);
  constexpr int64_t ld = 20;
  for (int trial = 0; trial < 200; ++trial) {
    float p[16 * ld];
    for (float& v : p) v = std::ldexp(mant(gen), expo(gen));
    float got[16];
    _mm512_storeu_ps(got, cpu::sum16_lanes(p, ld));
    for (int o = 0; o < 16; ++o) {
      float lanes[16];
      for (int l = 0; l < 16; ++l) lanes[l] = p[l * ld + o];
      ASSERT_EQ(std::bit_cast<uint32_t>(got[o]), std::bit_cast<uint32_t>(cpu::sum16(lanes)))
          << "output " << o;
    }
  }
}
#endif

#if ZAYA_AVX2
TEST(SeqVec, Sum16x8EqualsSum16) {
  // The AVX2 form of the same reduction (8 outputs at once), under the same contract.
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-6, 6);
  for (int trial = 0; trial < 200; ++trial) {
    float acc[128];
    for (float& v : acc) v = std::ldexp(mant(gen), expo(gen));
    float got[8];
    _mm256_storeu_ps(got, cpu::sum16_x8(acc));
    for (int o = 0; o < 8; ++o) {
      float lanes[16];
      std::copy(acc + 16 * o, acc + 16 * o + 16, lanes);
      ASSERT_EQ(std::bit_cast<uint32_t>(got[o]), std::bit_cast<uint32_t>(cpu::sum16(lanes)))
          << "output " << o;
    }
  }
}

TEST(SeqVec, ExpFastV8MatchesScalarAndExpSumsMatchLoops) {
  // expf_fast_v8 does expf_fast's operations (GCC contracts the scalar form to the same FMAs), and
  // the AVX2 exp sums keep the plain loops' 16 partial sums and sum16's tree: all bitwise (a tail of
  // n mod 16 goes through the scalar form in both).
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-90.0f, 5.0f);
  for (int trial = 0; trial < 100; ++trial) {
    alignas(32) float x[8], got[8];
    for (float& v : x) v = u(gen);
    _mm256_storeu_ps(got, cpu::expf_fast_v8(_mm256_loadu_ps(x)));
    for (int l = 0; l < 8; ++l)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[l]), std::bit_cast<uint32_t>(cpu::expf_fast(x[l]))) << x[l];
  }
  for (int64_t n : {1, 15, 16, 17, 100, 1000}) {
    std::vector<float> x(static_cast<size_t>(n)), e(x.size());
    std::uniform_real_distribution<float> v(-20.0f, 3.0f);
    for (float& a : x) a = v(gen);
    float acc[16] = {};
    for (int64_t i = 0; i < n; ++i) acc[i % 16] += cpu::expf_fast(x[i] - 1.0f);
    const float want = cpu::sum16(acc);
    const float s1 = cpu::sum_expf(x.data(), n, 1.0f);
    const float s2 = cpu::exp_store_sum(e.data(), x.data(), n, 1.0f);
    EXPECT_EQ(std::bit_cast<uint32_t>(s1), std::bit_cast<uint32_t>(want)) << n;
    EXPECT_EQ(std::bit_cast<uint32_t>(s2), std::bit_cast<uint32_t>(want)) << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(e[i], cpu::expf_fast(x[i] - 1.0f)) << i;
    EXPECT_EQ(cpu::maxf(x.data(), n), *std::max_element(x.begin(), x.end()));
  }
}
#endif

#if defined(__AVX512F__)
TEST(SeqVec, ExpFastVectorMatchesScalar) {
  // The attention kernels' 16-lane exp against expf_fast (itself ~1 ulp from exp in double, tested
  // through softmax and SwiGLU): the same operations, so equal bits wherever the scalar form's
  // `a * b + c` contracts to the FMA the vector form uses; 1 ulp allowed where it does not.
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.01171875f) x.push_back(v);
  for (float v : {0.0f, -0.0f, -87.0f, 88.0f, -1e-30f, 1e-30f, -INFINITY}) x.push_back(v);
  while (x.size() % 16) x.push_back(0.5f);
  for (size_t i = 0; i < x.size(); i += 16) {
    float y[16];
    _mm512_storeu_ps(y, cpu::expf_fast_v(_mm512_loadu_ps(x.data() + i)));
    for (int l = 0; l < 16; ++l) {
      const float s = cpu::expf_fast(x[i + l]);
      ASSERT_LE(std::abs(std::bit_cast<int32_t>(y[l]) - std::bit_cast<int32_t>(s)), 1) << "x = " << x[i + l];
    }
  }
}

TEST(SeqVec, ExpNonpositiveMatchesExpFastVector) {
  // The fused head's softmax exp against expf_fast_v on every 256th float of [−87, 0] (4.4 million
  // values): the same reduction and polynomial, n rounded from v·log2(e) instead of from its exact
  // FMA, so at most 1 ulp apart (a rounding tie); the count of differing values is printed. Below
  // −87: exact small values or 0 (expf_fast_v clamps to exp(−87)); −inf gives 0; NaN stays NaN.
  int64_t differ = 0, n = 0;
  float x[16];
  int lanes = 0;
  auto check = [&] {
    float a[16], b[16];
    _mm512_storeu_ps(a, cpu::expf_fast_v(_mm512_loadu_ps(x)));
    _mm512_storeu_ps(b, cpu::expf_nonpositive_v(_mm512_loadu_ps(x)));
    for (int l = 0; l < lanes; ++l) {
      const int32_t d = std::abs(std::bit_cast<int32_t>(a[l]) - std::bit_cast<int32_t>(b[l]));
      ASSERT_LE(d, 1) << "v = " << x[l];
      differ += d != 0;
    }
    n += lanes;
    lanes = 0;
  };
  for (uint32_t u = std::bit_cast<uint32_t>(-87.0f); u >= 0x80000000u; u -= 256) {  // −87 → −0 by magnitude
    x[lanes++] = std::bit_cast<float>(u);
    if (lanes == 16) check();
  }
  if (lanes) check();
  std::printf("expf_nonpositive_v: %lld of %lld values differ from expf_fast_v by 1 ulp\n",
              static_cast<long long>(differ), static_cast<long long>(n));
  const float special[16] = {-90.0f, -100.0f, -103.0f, -104.0f, -200.0f, -1e30f, -INFINITY, NAN,
                             0.0f,   -0.0f,   -1e-30f, -1.0f,   -0.5f,   -2.5f,  -20.0f,    -50.0f};
  float y[16];
  _mm512_storeu_ps(y, cpu::expf_nonpositive_v(_mm512_loadu_ps(special)));
  for (int l = 0; l < 16; ++l) {
    if (std::isnan(special[l])) {
      EXPECT_TRUE(std::isnan(y[l]));
      continue;
    }
    const double want = std::exp(static_cast<double>(special[l]));
    EXPECT_NEAR(y[l], want, 2e-7 * want + 1e-45) << "v = " << special[l];  // ~2 ulp, or a subnormal's spacing
  }
}

TEST(SeqVec, Transpose16) {
  std::vector<float> src(16 * 21), dst(16 * 19, -1.0f);  // padded leading dimensions 21 and 19
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  cpu::transpose16(dst.data(), 19, src.data(), 21);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) ASSERT_EQ(dst[c * 19 + r], src[r * 21 + c]) << r << "," << c;
  for (int c = 0; c < 16; ++c)
    for (int r = 16; r < 19; ++r) EXPECT_EQ(dst[c * 19 + r], -1.0f);  // nothing past 16 written
}
#endif

}  // namespace
}  // namespace zaya::ops
