// The per-element math that the CUDA kernels run (ops/elementwise_math.h), run here on the host
// against float64 formulas, so that what a GPU computes is tested on machines without one.
//
// Tolerance: each function is a handful of float operations (≤ ½ ulp each) around the C library's
// expf/erff (≤ 2 ulp; CUDA's device versions have the same bound). The error relative to the size of
// the terms is then ~10 ulp ≈ 6e-7; the test allows 2e-6 of max(1, |terms|) where terms is the
// largest term's magnitude (|x| for silu'(x) = σ + x·σ·(1 − σ), whose terms cancel near its zero).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "zaya/ops/elementwise_math.h"

namespace zaya::ops {
namespace {

double sigmoid64(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu64(double x) { return x * sigmoid64(x); }
double silu_grad64(double x) {
  const double s = sigmoid64(x);
  return s * (1.0 + x * (1.0 - s));
}
double gelu64(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_grad64(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

constexpr double kTol = 2e-6;

// x from −100 to 100: both tails (past kTail = −80 the functions are exactly 0), the transition
// region in steps of 1/64, and a few points near 0.
std::vector<float> points() {
  std::vector<float> xs;
  for (int i = -6400; i <= 6400; ++i) xs.push_back(static_cast<float>(i) / 64.0f);
  for (float x : {-100.0f, -85.0f, -80.5f, -79.5f, -30.0f, 30.0f, 100.0f, 1e-6f, -1e-6f, 0.0f}) xs.push_back(x);
  return xs;
}

void expect_close(const char* what, float x, float got, double ref, double scale) {
  EXPECT_LE(std::fabs(got - ref), kTol * std::max(1.0, scale)) << what << "(" << x << ") = " << got << ", float64 "
                                                              << ref;
}

TEST(ElementwiseMath, SiluAndItsGradientMatchFloat64) {
  for (float x : points()) {
    expect_close("silu", x, math::silu(x), silu64(x), std::fabs(x));
    expect_close("silu_grad", x, math::silu_grad(x), silu_grad64(x), std::fabs(x));
  }
}

TEST(ElementwiseMath, ExactGeluAndItsGradientMatchFloat64) {
  for (float x : points()) {
    expect_close("gelu", x, math::gelu(x), gelu64(x), std::fabs(x));
    expect_close("gelu_grad", x, math::gelu_grad(x), gelu_grad64(x), std::fabs(x));
  }
}

TEST(ElementwiseMath, SwigluAndItsGradientsMatchFloat64) {
  for (float g : points()) {
    const float v = 0.75f - g / 200.0f, dy = 1.25f;
    expect_close("swiglu", g, math::swiglu(g, v), silu64(g) * v, std::fabs(g * v));
    const math::SwigluGrad d = math::swiglu_grad(dy, g, v);
    expect_close("swiglu dg", g, d.dg, dy * v * silu_grad64(g), std::fabs(dy * v * g));
    expect_close("swiglu dv", g, d.dv, dy * silu64(g), std::fabs(dy * g));
  }
}

TEST(ElementwiseMath, TailsAreExactZerosNotSubnormals) {
  // Below kTail the CPU kernels give exact 0 (subnormals are slow there); these match.
  for (float x : {-80.5f, -100.0f, -1e30f}) {
    EXPECT_EQ(math::sigmoid(x), 0.0f) << x;
    EXPECT_EQ(math::silu(x), 0.0f) << x;
    EXPECT_EQ(math::silu_grad(x), 0.0f) << x;
    EXPECT_EQ(math::gelu_grad(x), 0.0f) << x;  // Φ(x) rounds to 0 and φ is taken as 0
  }
  EXPECT_TRUE(std::isnan(math::silu(NAN)));
  EXPECT_TRUE(std::isnan(math::gelu(NAN)));
}

}  // namespace
}  // namespace zaya::ops
