// ZayaModel::backward's "gradients [a, b) are final" callback: the ranges cover every parameter
// exactly once, and what a range holds when it is reported is bitwise what it holds when the
// backward returns (nothing touches it later), on every way the experts run, with and without
// activation recomputation (which re-runs layer forwards inside the backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "optim/tiny.h"
#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/experts_cpu.h"

namespace zaya::model {
namespace {

// The optimizer tests' tiny model with a third layer, so that one layer's range is reported from
// inside another's backward (not only at the end).
ModelConfig small() {
  ModelConfig c = optim::test::tiny_config();
  c.num_hidden_layers = 3;
  return c;
}

struct Reported {
  int64_t begin, end;
  std::vector<float> values;  // the range's gradients when it was reported
};

struct Outcome {
  std::vector<Reported> reports;
  std::vector<float> grads;  // the whole gradient after backward
};

Outcome run_backward(int threads, bool fused, bool with_callback, bool recompute = false) {
  set_num_threads(threads);
  ops::cpu::set_fused_experts(fused);
  const ModelConfig c = small();
  const int64_t B = 2, T = 32;
  ZayaModel m(c, B, T);
  m.init(11);
  m.set_recompute(recompute);
  Tensor beta = m.balancing_biases();
  fill_normal(beta, 3, 0, 0.0f, 0.05f);  // spread the tokens over the experts
  std::vector<int32_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 5 + 1) % c.vocab_size);
  }
  Outcome r;
  m.forward(Tensor::borrow(ids.data(), Shape{B, T}, DType::i32),
            Tensor::borrow(targets.data(), Shape{B, T}, DType::i32));
  const float* g = m.grads_flat().data<float>();
  if (with_callback)
    m.backward([&](int64_t a, int64_t b) { r.reports.push_back({a, b, std::vector<float>(g + a, g + b)}); });
  else
    m.backward();
  r.grads.assign(g, g + m.grads_flat().numel());
  ops::cpu::set_fused_experts(true);
  set_num_threads(default_num_threads());
  return r;
}

TEST(GradReady, RangesCoverEveryParameterOnceAndAreFinalWhenReported) {
  for (int threads : {1, 2})
    for (bool fused : {true, false})
      for (bool recompute : {false, true}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, " << (fused ? "fused" : "grouped") << " experts"
                                        << (recompute ? ", recompute" : ""));
        const Outcome r = run_backward(threads, fused, true, recompute);
        const int64_t P = static_cast<int64_t>(r.grads.size());
        // Order as documented: the final norm first, then layers last to first, then the embedding part.
        ASSERT_EQ(r.reports.size(), 1u + 3u + 1u);
        const ModelConfig c = small();
        ZayaModel probe(c, 1, 1);
        EXPECT_EQ(r.reports[0].begin, probe.param_offset(probe.param_index("model.norm.weight")));
        for (int l = 0; l < 3; ++l) {
          const auto [b, e] = probe.layer_range(2 - l);
          EXPECT_EQ(r.reports[1 + l].begin, b);
          EXPECT_EQ(r.reports[1 + l].end, e);
        }
        EXPECT_EQ(r.reports.back().begin, 0);
        // Disjoint and complete.
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (const Reported& x : r.reports) ranges.emplace_back(x.begin, x.end);
        std::sort(ranges.begin(), ranges.end());
        int64_t at = 0;
        for (const auto& [b, e] : ranges) {
          EXPECT_EQ(b, at) << "a gap or an overlap before [" << b << ", " << e << ")";
          EXPECT_LT(b, e);
          at = e;
        }
        EXPECT_EQ(at, P);
        // Final when reported: bitwise what the backward leaves.
        for (const Reported& x : r.reports)
          EXPECT_EQ(std::memcmp(x.values.data(), r.grads.data() + x.begin, x.values.size() * sizeof(float)), 0)
              << "gradients [" << x.begin << ", " << x.end << ") changed after they were reported final";
      }
}

TEST(GradReady, TheCallbackChangesNothing) {
  for (int threads : {1, 2}) {
    const Outcome with = run_backward(threads, true, true), without = run_backward(threads, true, false);
    ASSERT_EQ(with.grads.size(), without.grads.size());
    EXPECT_EQ(std::memcmp(with.grads.data(), without.grads.data(), with.grads.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace zaya::model
