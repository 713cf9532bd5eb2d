// Activation recomputation (ZayaModel::set_recompute): the backward re-runs each layer's forward
// from its saved input, so the loss, every parameter gradient and the routing statistics must be
// bitwise those of the step without it (tolerance 0: the re-run is the same deterministic
// computation on the same inputs); the arena must shrink by exactly what the plan says; the
// cached decoder, which reads every layer's saved activations, must still work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/random_model.h"
#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/model/generate.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/experts_cpu.h"

namespace zaya::model {
namespace {

using Dims = test::ModelDims;
ModelConfig make_config(const Dims& d) { return test::small_config(d, 64); }

// One layer (nothing to recompute: the last layer's activations are still there), two (the
// alternating u/att buffers both used), three and four (an even and an odd layer recomputed while
// the layer above's weight gradients are pending), GQA and G = 1, odd nkv.
const Dims kConfigs[] = {
    {2, 1, 8, 3, 1, 8, 8, 16, 24},
    {4, 2, 16, 4, 2, 16, 24, 32, 64},
    {6, 3, 16, 3, 3, 8, 16, 32, 40},
    {2, 2, 8, 2, 4, 8, 16, 16, 32},
};

void randomize(ZayaModel& m, uint64_t seed) { test::randomize(m, seed); }

struct Step {
  double loss = 0;
  std::vector<float> grads;
  std::vector<int64_t> counts;
  std::vector<int32_t> choices;
  std::vector<std::pair<int64_t, int64_t>> ready;
};

// Two accumulating steps (forward + backward twice, the second on other tokens), as gradient
// accumulation runs them: the second re-uses the shared activations the first's backward left.
Step run_steps(ZayaModel& m, int64_t B, int64_t T) {
  const int64_t V = m.config().vocab_size;
  Step r;
  m.zero_grad();
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<int32_t> ids(static_cast<size_t>(B * T)), tg(static_cast<size_t>(B * T));
    for (int64_t i = 0; i < B * T; ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + 11 * micro + 5) % V);
      tg[i] = i % 9 == 4 ? -100 : static_cast<int32_t>((i * 13 + 7 * micro + 1) % V);
    }
    r.loss += m.forward(Tensor::borrow(ids.data(), Shape{B, T}, DType::i32),
                        Tensor::borrow(tg.data(), Shape{B, T}, DType::i32));
    r.ready.clear();
    m.backward([&](int64_t a, int64_t b) { r.ready.emplace_back(a, b); });
    m.add_expert_counts(r.counts);
    for (int l = 0; l < m.config().num_hidden_layers; ++l) {
      Tensor c = m.router_choice(l);
      r.choices.insert(r.choices.end(), c.data<int32_t>(), c.data<int32_t>() + c.numel());
    }
  }
  const float* g = m.grads_flat().data<float>();
  r.grads.assign(g, g + m.grads_flat().numel());
  return r;
}

// Names the first parameter whose gradient differs, for the failure message.
std::string first_difference(const ZayaModel& m, const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const int64_t off = m.param_offset(static_cast<int>(i)), n = m.specs()[i].shape.numel();
    if (std::memcmp(a.data() + off, b.data() + off, static_cast<size_t>(n) * sizeof(float)) != 0)
      return m.specs()[i].name;
  }
  return "(none)";
}

TEST(Recompute, LossAndEveryGradientBitwiseAsWithout) {
  int ci = 0;
  for (const Dims& d : kConfigs) {
    const ModelConfig c = make_config(d);
    for (DType gemm : {DType::f32, DType::bf16})
      for (int threads : {1, 2})
        for (bool fused : {true, false}) {
          SCOPED_TRACE(testing::Message() << "config " << ci << ", gemm " << dtype_name(gemm) << ", " << threads
                                          << " threads, " << (fused ? "fused" : "grouped") << " experts");
          set_num_threads(threads);
          ops::cpu::set_fused_experts(fused);
          const int64_t B = 2, T = 24;
          ZayaModel plain(c, B, T), rc(c, B, T);
          randomize(plain, 31 + ci);
          randomize(rc, 31 + ci);
          plain.set_gemm_dtype(gemm);
          rc.set_gemm_dtype(gemm);
          rc.set_recompute(true);
          ASSERT_TRUE(rc.recompute());
          const Step a = run_steps(plain, B, T), b = run_steps(rc, B, T);
          EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
          ASSERT_EQ(a.grads.size(), b.grads.size());
          EXPECT_EQ(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)), 0)
              << "first differing gradient: " << first_difference(plain, a.grads, b.grads);
          EXPECT_EQ(a.counts, b.counts);
          EXPECT_EQ(a.choices, b.choices);
          EXPECT_EQ(a.ready, b.ready);
          EXPECT_EQ(b.ready, rc.ready_order());
        }
    ++ci;
  }
  ops::cpu::set_fused_experts(true);
  set_num_threads(default_num_threads());
}

TEST(Recompute, ArenaShrinksByWhatThePlanSays) {
  for (const Dims& d : kConfigs) {
    const ModelConfig c = make_config(d);
    for (DType gemm : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(testing::Message() << c.num_hidden_layers << " layers, gemm " << dtype_name(gemm));
      // N = 64 rows: every [N, k] tensor is a multiple of the arena's 64-byte alignment, so no
      // padding blurs the sums below.
      const int64_t B = 2, T = 32, N = B * T, L = c.num_hidden_layers;
      ZayaModel m(c, B, T);
      m.set_gemm_dtype(gemm);
      const size_t without = m.activation_bytes();
      const double layer = m.saved_bytes_per_token_per_layer() * static_cast<double>(N);
      EXPECT_EQ(m.kept_bytes_per_token_per_layer(), m.saved_bytes_per_token_per_layer());
      m.set_recompute(true);
      const size_t with = m.activation_bytes();
      // The plan: layers 1..L−1 give up their saved activations and keep only r [N, R] f32 and
      // their choice [N] i32; the odd layers' u [N, H] and att [N, q] take one buffer each (with
      // bf16 GEMMs: their bf16 copies, which the pending weight gradients read, and att's f32; u's
      // f32 is the model's one staging block then).
      const double kept = 4.0 * static_cast<double>(N * (c.router_hidden_size + 1));
      const double H = static_cast<double>(c.hidden_size), q = static_cast<double>(c.q_dim());
      const double u_att = gemm == DType::bf16 ? 2.0 * (H + q) + 4.0 * q : 4.0 * (H + q);
      const double second_u_att = L > 1 ? u_att * static_cast<double>(N) : 0.0;
      const double predicted =
          static_cast<double>(without) - static_cast<double>(L - 1) * (layer - kept) + second_u_att;
      EXPECT_EQ(static_cast<double>(with), predicted);
      if (L > 1) {
        EXPECT_LT(with, without);
        EXPECT_EQ(m.kept_bytes_per_token_per_layer() * static_cast<double>(N), kept);
      }
      EXPECT_EQ(m.saved_bytes_per_token_per_layer() * static_cast<double>(N), layer);
      std::printf("[ arena    ] %lld layers, gemm %s: %zu -> %zu bytes (%.3f)\n", static_cast<long long>(L),
                  std::string(dtype_name(gemm)).c_str(), without, with, static_cast<double>(with) / static_cast<double>(without));
      m.set_recompute(false);
      EXPECT_EQ(m.activation_bytes(), without);
    }
  }
}

TEST(Recompute, TheRecomputeIsTimedAsOnePartOfTheBackward) {
  const ModelConfig c = make_config(kConfigs[3]);  // 4 layers: 3 re-runs per backward
  const int64_t B = 1, T = 16;
  ZayaModel m(c, B, T);
  randomize(m, 5);
  m.set_recompute(true);
  m.time_sections(true);
  run_steps(m, B, T);  // two backward passes
  int64_t recompute_calls = -1, forward_input_norm_calls = -1;
  for (const auto& s : m.section_times()) {
    if (s.name == "backward: recompute the layer's forward") recompute_calls = s.calls;
    if (s.name == "forward: input norm, qkv projection") forward_input_norm_calls = s.calls;
  }
  EXPECT_EQ(recompute_calls, 2 * 3);
  EXPECT_EQ(forward_input_norm_calls, 2 * 4) << "the re-runs were counted as forward parts too";
}

TEST(Recompute, SwitchingNeedsANewForwardAndLayerActsNeedsItOff) {
  const ModelConfig c = make_config(kConfigs[1]);
  const int64_t B = 1, T = 8;
  ZayaModel m(c, B, T);
  randomize(m, 2);
  std::vector<int32_t> ids(B * T, 3), tg(B * T, 5);
  const Tensor tid = Tensor::borrow(ids.data(), Shape{B, T}, DType::i32),
               ttg = Tensor::borrow(tg.data(), Shape{B, T}, DType::i32);
  m.forward(tid, ttg);
  m.set_recompute(true);  // re-plans: the forward's activations are gone
  EXPECT_THROW(m.backward(), Error);
  EXPECT_THROW(m.layer_acts(0), Error);
  m.forward(tid, ttg);
  m.backward();
  m.set_recompute(false);
  EXPECT_NO_THROW(m.layer_acts(0));
}

TEST(Recompute, GenerateGivesTheSameTokensAndLeavesRecomputeOn) {
  const ModelConfig c = make_config(kConfigs[2]);
  std::vector<int32_t> prompt{4, 8, 15, 16, 23, 42 % 40};
  const Tensor tp = Tensor::borrow(prompt.data(), Shape{2, 3}, DType::i32);
  GenerateOptions opt;
  opt.max_new = 12;
  opt.sampling = {false, 1.2, 0.9, 77};
  ZayaModel plain(c, 2, 3), rc(c, 2, 3);
  randomize(plain, 9);
  randomize(rc, 9);
  rc.set_recompute(true);
  const size_t rc_bytes = rc.activation_bytes();
  const auto a = generate(plain, tp, opt), b = generate(rc, tp, opt);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(rc.recompute());
  EXPECT_EQ(rc.activation_bytes(), rc_bytes);
}

}  // namespace
}  // namespace zaya::model
