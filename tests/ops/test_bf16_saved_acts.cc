// The ops' bf16 saved-activation inputs (ZayaModel::set_activation_dtype, the experts' part): the
// SwiGLU backward's gu, the combine backward's y and the experts op's gu16/y16. Each bf16 input is
// widened exactly as it is read, so every result must be bitwise the f32 op's on the widened input
// (tolerance 0: the same arithmetic on the same values). The experts' forward only adds the copies:
// its f32 outputs stay the bits of the op without them.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "ops/gradcheck.h"
#include "test_util.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/experts.h"
#include "zaya/ops/moe.h"

namespace zaya::ops {
namespace {

using test::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor to_bf16(const Tensor& f) {
  Tensor b = Tensor::empty(f.shape(), DType::bf16);
  cast_to_bf16(b, f);
  return b;
}

Tensor widened(const Tensor& b) {
  Tensor f = Tensor::empty(b.shape(), DType::f32);
  cast_to_f32(f, b);
  return f;
}

// inter 37: neither a multiple of the 8 or 16 lanes of the vector loops (their tails run), and
// 2I = 74 (rows that start off a vector boundary); 129 rows (one of the CPU's 256-row blocks) and
// 600 (two whole blocks and a part).
TEST(Bf16SavedActs, SwigluBackwardOnBf16GuIsTheF32OpOnTheWidenedGu) {
  for (int64_t inter : {int64_t{37}, int64_t{64}})
  for (int64_t n : {int64_t{129}, int64_t{600}}) {
    SCOPED_TRACE(testing::Message() << "inter " << inter << ", rows " << n);
    const Tensor gu16 = to_bf16(random_tensor({n, 2 * inter}, 3, 3.0f)), dy = random_tensor({n, inter}, 4);
    Tensor d16 = Tensor::empty({n, 2 * inter}, DType::f32), d32 = Tensor::empty({n, 2 * inter}, DType::f32);
    swiglu_backward(d16, dy, gu16);
    swiglu_backward(d32, dy, widened(gu16));
    EXPECT_TRUE(same_bits(d16, d32));
  }
  const std::string msg = test::error_of([] {
    swiglu_backward(Tensor::empty({2, 4}, DType::f32), Tensor::empty({2, 2}, DType::f32),
                    Tensor::empty({2, 4}, DType::i32));
  });
  EXPECT_NE(msg.find("swiglu_backward: gu must be f32 or bf16"), std::string::npos) << msg;
}

// H 333 (dotf's 16-lane tail) and 256; a quarter of the tokens skipped.
TEST(Bf16SavedActs, CombineBackwardOnBf16YIsTheF32OpOnTheWidenedY) {
  const int64_t N = 300, E = 6;
  Tensor choice = Tensor::empty({N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>((n * 5 + n / 7) % (E + 2) % (E + 1));
  Tensor counts = Tensor::empty({E}, DType::i32), offsets = Tensor::empty({E + 1}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32), src = Tensor::empty({N}, DType::i32);
  const int64_t M = moe_plan(counts, offsets, pos, src, choice, N, E);
  ASSERT_LT(M, N);
  const Tensor weight = random_tensor({N}, 5);
  for (int64_t H : {int64_t{333}, int64_t{256}}) {
    SCOPED_TRACE(H);
    const Tensor y16 = to_bf16(random_tensor({N, H}, 6)), dout = random_tensor({N, H}, 7);
    Tensor dy16 = Tensor::zeros({N, H}, DType::f32), dy32 = Tensor::zeros({N, H}, DType::f32);
    Tensor dw16 = Tensor::empty({N}, DType::f32), dw32 = Tensor::empty({N}, DType::f32);
    moe_unpermute_backward(dy16, dw16, dout, y16, weight, pos, M, N, H);
    moe_unpermute_backward(dy32, dw32, dout, widened(y16), weight, pos, M, N, H);
    EXPECT_TRUE(same_bits(dy16, dy32));
    EXPECT_TRUE(same_bits(dw16, dw32));
  }
  const std::string msg = test::error_of([&] {
    moe_unpermute_backward(Tensor::zeros({N, 4}, DType::f32), Tensor::empty({N}, DType::f32),
                           Tensor::zeros({N, 4}, DType::f32), Tensor::zeros({N, 4}, DType::i32), weight, pos, M, N, 4);
  });
  EXPECT_NE(msg.find("moe_unpermute_backward: y must be f32 or bf16"), std::string::npos) << msg;
}

constexpr int64_t N = 200, H = 96, I = 80, E = 5;

struct Routed {
  Tensor x, offsets, src;
  int64_t M = 0;
};

Routed route() {
  Routed r;
  r.x = random_tensor({N, H}, 1);
  Tensor choice = Tensor::empty({N}, DType::i32), counts = Tensor::empty({E}, DType::i32);
  for (int64_t n = 0; n < N; ++n) choice.data<int32_t>()[n] = static_cast<int32_t>((n * 7 + n / 3) % (E + 1));
  r.offsets = Tensor::empty({E + 1}, DType::i32);
  r.src = Tensor::empty({N}, DType::i32);
  Tensor pos = Tensor::empty({N}, DType::i32);
  r.M = moe_plan(counts, r.offsets, pos, r.src, choice, N, E);
  return r;
}

struct Bufs {
  ExpertActs a;
  ExpertScratch s;
  ExpertWeights g;
  Tensor dxp;
};

// gu16 and y16 with `saved16`; xp16, act16 and the backward's bf16 scratch with bf16 weights.
Bufs buffers(bool b16, bool saved16) {
  auto z = [](const Shape& s, DType t = DType::f32) { return Tensor::zeros(s, t); };
  auto z16 = [&](bool on, const Shape& s) { return on ? z(s, DType::bf16) : Tensor{}; };
  Bufs b;
  b.a = {z({N, H}), z({N, 2 * I}), z({N, I}), z({N, H}), z16(b16, {N, H}), z16(b16, {N, I}),
         z16(saved16, {N, 2 * I}), z16(saved16, {N, H})};
  b.s = {z({N, I}), z({N, 2 * I}), z16(b16, {N, H}), z16(b16, {N, 2 * I})};
  b.g = {random_tensor({E, 2 * I, H}, 5), random_tensor({E, H, I}, 6)};  // gradients accumulate onto these
  b.dxp = z({N, H});
  return b;
}

// Forward: gu, act, y (and xp16, act16) bitwise those of the op without the copies, gu16 and y16
// the bf16 roundings of gu and y. Backward from gu16: bitwise the op without copies whose gu holds
// the widened gu16 (on the CPU, f32 weights with the copies run the grouped way instead of the
// fused one, which gives the same bits). Both weight dtypes.
TEST(Bf16SavedActs, ExpertsCopyGuAndYAndTheBackwardReadsGu16AsTheWidenedGu) {
  const Routed r = route();
  ASSERT_GT(r.M, 0);
  auto rows = [&](const Tensor& t) { return t.slice(0, r.M); };
  for (bool b16 : {false, true}) {
    SCOPED_TRACE(b16 ? "bf16 weights" : "f32 weights");
    const DType wt = b16 ? DType::bf16 : DType::f32;
    const ExpertWeights w{random_tensor({E, 2 * I, H}, 2, 0.2f, wt), random_tensor({E, H, I}, 3, 0.2f, wt)};
    const Tensor dy = random_tensor({N, H}, 4);
    Bufs plain = buffers(b16, false), saved = buffers(b16, true);
    experts_forward(plain.a, r.x, r.src, r.offsets, w, r.M);
    experts_forward(saved.a, r.x, r.src, r.offsets, w, r.M);
    for (auto f : {&ExpertActs::xp, &ExpertActs::gu, &ExpertActs::act, &ExpertActs::y})
      EXPECT_TRUE(same_bits(rows(saved.a.*f), rows(plain.a.*f)));
    if (b16) {
      EXPECT_TRUE(same_bits(rows(saved.a.xp16), rows(plain.a.xp16)));
      EXPECT_TRUE(same_bits(rows(saved.a.act16), rows(plain.a.act16)));
    }
    EXPECT_TRUE(same_bits(rows(saved.a.gu16), to_bf16(rows(saved.a.gu))));
    EXPECT_TRUE(same_bits(rows(saved.a.y16), to_bf16(rows(saved.a.y))));

    // The reference reads gu = widened gu16; the op under test gets a poisoned gu, which it must not read.
    cast_to_f32(rows(plain.a.gu), rows(saved.a.gu16));
    rows(saved.a.gu).fill_(std::nan(""));
    experts_backward(plain.dxp, plain.g, dy, r.offsets, w, plain.a, plain.s, r.M, {});
    experts_backward(saved.dxp, saved.g, dy, r.offsets, w, saved.a, saved.s, r.M, {});
    EXPECT_TRUE(same_bits(rows(saved.dxp), rows(plain.dxp)));
    EXPECT_TRUE(same_bits(saved.g.gate_up, plain.g.gate_up));
    EXPECT_TRUE(same_bits(saved.g.down, plain.g.down));
    // ...and from the f32 gu the gradients differ (the rounding reached them).
    Bufs f32 = buffers(b16, false);
    experts_forward(f32.a, r.x, r.src, r.offsets, w, r.M);
    experts_backward(f32.dxp, f32.g, dy, r.offsets, w, f32.a, f32.s, r.M, {});
    EXPECT_FALSE(same_bits(f32.g.gate_up, plain.g.gate_up));
  }
}

TEST(Bf16SavedActs, ExpertsNameAWrongGu16OrY16) {
  const Routed r = route();
  const ExpertWeights w{random_tensor({E, 2 * I, H}, 2, 0.2f), random_tensor({E, H, I}, 3, 0.2f)};
  Bufs b = buffers(false, true);
  ExpertActs bad = b.a;
  bad.gu16 = Tensor::zeros({N, 2 * I}, DType::f32);
  std::string msg = test::error_of([&] { experts_forward(bad, r.x, r.src, r.offsets, w, r.M); });
  EXPECT_NE(msg.find("experts_forward: gu16"), std::string::npos) << msg;
  bad = b.a;
  bad.y16 = Tensor::zeros({1, H}, DType::bf16);
  msg = test::error_of([&] { experts_backward(b.dxp, b.g, b.dxp, r.offsets, w, bad, b.s, r.M, {}); });
  EXPECT_NE(msg.find("experts_backward: y16 has shape [1, 96]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace zaya::ops
