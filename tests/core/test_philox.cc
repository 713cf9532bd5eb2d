#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/philox.h"
#include "zaya/core/random.h"

namespace zaya {
namespace {

// Random123's published known-answer vectors (tests/kat_vectors) for Philox4x32-10.
TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    PhiloxBlock ctr;
    uint32_t k0, k1;
    PhiloxBlock out;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    PhiloxBlock got = philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], k.out.v[i]) << "lane " << i;
  }
}

struct Moments {
  double mean = 0, var = 0, skew = 0, kurt = 0;
};
Moments moments(const std::vector<float>& x) {
  Moments m;
  double n = static_cast<double>(x.size());
  for (float v : x) m.mean += v;
  m.mean /= n;
  for (float v : x) {
    double d = v - m.mean;
    m.var += d * d;
    m.skew += d * d * d;
    m.kurt += d * d * d * d;
  }
  m.var /= n;
  m.skew = m.skew / n / std::pow(m.var, 1.5);
  m.kurt = m.kurt / n / (m.var * m.var);
  return m;
}

constexpr int64_t kN = 1 << 20;

TEST(Philox, UniformMoments) {
  Tensor t = Tensor::empty({kN}, DType::f32);
  fill_uniform(t, 1234, 0);
  std::vector<float> x(t.data<float>(), t.data<float>() + kN);
  for (float v : x) ASSERT_TRUE(v >= 0.0f && v < 1.0f);
  Moments m = moments(x);
  // Standard error of the mean is sqrt(1/12 / N) = 2.8e-4; 5 sigma = 1.4e-3. The variance's
  // standard error is about sqrt((1/80 - 1/144) / N) = 7e-5; 5 sigma = 3.6e-4.
  EXPECT_NEAR(m.mean, 0.5, 1.4e-3);
  EXPECT_NEAR(m.var, 1.0 / 12.0, 3.6e-4);
  // A uniform has zero skew; the sample skew's standard error here is about 1e-3, so 0.01 is ~10 se.
  EXPECT_NEAR(m.skew, 0.0, 0.01);
}

TEST(Philox, NormalMoments) {
  Tensor t = Tensor::empty({kN}, DType::f32);
  fill_normal(t, 99, 7, 0.0f, 1.0f);
  std::vector<float> x(t.data<float>(), t.data<float>() + kN);
  Moments m = moments(x);
  // N = 2^20: se(mean) = 1e-3, se(var) = sqrt(2/N) = 1.4e-3, se(skew) = sqrt(6/N) = 2.4e-3,
  // se(kurtosis) = sqrt(24/N) = 4.8e-3. Bounds are 5 standard errors.
  EXPECT_NEAR(m.mean, 0.0, 5e-3);
  EXPECT_NEAR(m.var, 1.0, 7e-3);
  EXPECT_NEAR(m.skew, 0.0, 1.2e-2);
  EXPECT_NEAR(m.kurt, 3.0, 2.4e-2);
}

TEST(Philox, OffsetsAddressOneStream) {
  // (seed, offset) must index one stream: filling at offset k equals the tail of offset 0.
  Tensor a = Tensor::empty({100}, DType::f32), b = Tensor::empty({90}, DType::f32);
  fill_normal(a, 5, 0);
  fill_normal(b, 5, 10);
  for (int i = 0; i < 90; ++i) EXPECT_EQ(a.data<float>()[10 + i], b.data<float>()[i]);
  Tensor c = Tensor::empty({100}, DType::f32);
  fill_normal(c, 6, 0);
  int same = 0;
  for (int i = 0; i < 100; ++i) same += a.data<float>()[i] == c.data<float>()[i];
  EXPECT_EQ(same, 0) << "different seeds should give different streams";
}

TEST(Philox, CudaMatchesCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason();
  for (bool normal : {false, true}) {
    Tensor host = Tensor::empty({4099}, DType::f32);
    Tensor dev = Tensor::empty({4099}, DType::f32, Device::cuda);
    if (normal) { fill_normal(host, 42, 3); fill_normal(dev, 42, 3); }
    else { fill_uniform(host, 42, 3); fill_uniform(dev, 42, 3); }
    Tensor back = dev.to(Device::cpu);
    // Uniforms are exact integer arithmetic; normals go through double log/sin/cos, which CUDA
    // computes to within 2 ulp of double, so after rounding to float they agree bit for bit.
    for (int i = 0; i < 4099; ++i) ASSERT_EQ(host.data<float>()[i], back.data<float>()[i]) << i;
  }
}

}  // namespace
}  // namespace zaya
