#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "zaya/core/dtype.h"

namespace zaya {
namespace {

uint16_t bits(float f) { return to_bf16(f).bits; }

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 1.5f, -0.0f, 65536.0f}) {
    EXPECT_EQ(to_float(to_bf16(f)), f);
  }
  EXPECT_EQ(bits(-0.0f), 0x8000);
}

TEST(Bf16, RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits; around 1.0 the spacing is 2^-7.
  const float ulp = std::ldexp(1.0f, -7);
  EXPECT_EQ(to_float(to_bf16(1.0f + ulp / 2)), 1.0f);              // tie: 1.0 has an even mantissa
  EXPECT_EQ(to_float(to_bf16(1.0f + 3 * ulp / 2)), 1.0f + 2 * ulp);  // tie: rounds up to even
  EXPECT_EQ(to_float(to_bf16(1.0f + ulp / 2 + std::ldexp(1.0f, -20))), 1.0f + ulp);  // above the tie
  EXPECT_EQ(to_float(to_bf16(1.0f + ulp / 2 - std::ldexp(1.0f, -20))), 1.0f);        // below the tie
  EXPECT_EQ(to_float(to_bf16(-(1.0f + 3 * ulp / 2))), -(1.0f + 2 * ulp));
}

TEST(Bf16, Subnormals) {
  float tiny = std::numeric_limits<float>::denorm_min();  // 0x00000001: rounds to +0
  EXPECT_EQ(bits(tiny), 0x0000);
  float sub = bits_float(0x00010000u);  // the smallest bf16 subnormal
  EXPECT_EQ(bits(sub), 0x0001);
  EXPECT_EQ(to_float(to_bf16(sub)), sub);
  EXPECT_EQ(bits(bits_float(0x00018000u)), 0x0002);  // tie between 1 and 2: to even (2)
  EXPECT_EQ(bits(bits_float(0x00028000u)), 0x0002);  // tie between 2 and 3: to even (2)
  EXPECT_EQ(bits(bits_float(0x007f8000u)), 0x0080);  // largest subnormal rounds up to the smallest normal
}

TEST(Bf16, InfinityAndOverflow) {
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits(inf), 0x7f80);
  EXPECT_EQ(bits(-inf), 0xff80);
  EXPECT_EQ(bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest bf16
  EXPECT_EQ(bits(bits_float(0x7f7f7fffu)), 0x7f7f);            // just below the tie: stays finite
}

TEST(Bf16, NaNStaysNaN) {
  // A NaN whose payload sits only in the low 16 bits would round into infinity with naive
  // truncation-plus-rounding; it must stay a (quiet) NaN, sign kept.
  float low_payload = bits_float(0x7f800001u);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(low_payload))));
  EXPECT_TRUE(std::isnan(to_float(to_bf16(bits_float(0xff800001u)))));
  EXPECT_EQ(bits(bits_float(0xff800001u)) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_EQ(bits(bits_float(0x7fffffffu)), 0x7fff);  // all-ones payload must not carry into the sign
}

}  // namespace
}  // namespace zaya
