// The expert-balance controller on a synthetic router, and end-to-end: a tiny ZayaModel trained by
// the Optimizer overfits a fixed batch (Muon on and off), bitwise deterministically, and a run
// resumed from state_tensors()/load_state continues the same trajectory bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "ops/gradcheck.h"
#include "optim/tiny.h"
#include "zaya/core/random.h"
#include "zaya/core/threads.h"
#include "zaya/model/zaya_model.h"
#include "zaya/optim/balancer.h"
#include "zaya/optim/muon.h"
#include "zaya/optim/optimizer.h"
#include "zaya/optim/schedule.h"

namespace zaya::optim {
namespace {

using Vec = std::vector<double>;
using zaya::test::to_f64;

// A fixed synthetic router: N tokens with softmax probabilities over E experts + skip whose logits
// favour high expert indices, routed by argmax(p + β) like the model (lowest index on ties).
struct SyntheticRouter {
  int64_t N, E;
  std::vector<float> p;  // [N, E+1]
  SyntheticRouter(int64_t n, int64_t e, uint64_t seed) : N(n), E(e), p(static_cast<size_t>(n * (e + 1))) {
    Tensor z = Tensor::empty(Shape{N, E + 1}, DType::f32);
    fill_normal(z, seed, 0);
    for (int64_t t = 0; t < N; ++t) {
      float* row = p.data() + t * (E + 1);
      double sum = 0;
      for (int64_t e2 = 0; e2 <= E; ++e2) {
        // Skew: expert e gets +0.25·e; skip is strongly disfavoured.
        float logit = z.data<float>()[t * (E + 1) + e2] + (e2 < E ? 0.25f * static_cast<float>(e2) : -3.0f);
        row[e2] = std::exp(logit);
        sum += row[e2];
      }
      for (int64_t e2 = 0; e2 <= E; ++e2) row[e2] = static_cast<float>(row[e2] / sum);
    }
  }
  std::vector<int64_t> counts(const Tensor& beta) const {
    std::vector<int64_t> c(static_cast<size_t>(E), 0);
    const float* b = beta.data<float>();
    for (int64_t t = 0; t < N; ++t) {
      const float* row = p.data() + t * (E + 1);
      int64_t best = 0;
      for (int64_t e = 1; e <= E; ++e)
        if (row[e] + b[e] > row[best] + b[best]) best = e;
      if (best < E) ++c[best];
    }
    return c;
  }
};

double max_share(const std::vector<int64_t>& c) {
  int64_t total = 0, mx = 0;
  for (int64_t x : c) total += x, mx = std::max(mx, x);
  return static_cast<double>(mx) / static_cast<double>(total);
}

TEST(Balancer, FirstStepPushesOverloadedExpertsDown) {
  const int64_t E = 4;
  Tensor beta = Tensor::zeros(Shape{1, E + 1}, DType::f32);
  beta.data<float>()[E] = -1.0f;
  BalanceController bc(1, E, 0.01, 0.9, 0.95, 1e-8);
  bc.step(beta, std::vector<int64_t>{70, 10, 10, 10});
  // First AdamW step: m̂/√v̂ = sign(g) exactly up to eps, so each bias moves by lr·sign(p_e − 1/E).
  // 1e-8 relative covers eps/|g| and float rounding.
  EXPECT_NEAR(beta.data<float>()[0], -0.01f, 1e-8);
  for (int e = 1; e < E; ++e) EXPECT_NEAR(beta.data<float>()[e], 0.01f, 1e-8);
  EXPECT_EQ(beta.data<float>()[E], -1.0f);  // skip is never pushed
  // A layer with no routed tokens is left alone.
  Tensor before = beta.clone();
  bc.step(beta, std::vector<int64_t>{0, 0, 0, 0});
  EXPECT_EQ(to_f64(beta), to_f64(before));
  EXPECT_THROW(bc.step(beta, std::vector<int64_t>{1, 2, 3}), Error);
}

TEST(Balancer, LrScaleAndEpsShapeTheStep) {
  const int64_t E = 4;
  // lr_scale multiplies the step: half the rate, half the first (sign-like) step.
  Tensor beta = Tensor::zeros(Shape{1, E + 1}, DType::f32);
  BalanceController bc(1, E, 0.01, 0.9, 0.95, 1e-8);
  bc.step(beta, std::vector<int64_t>{70, 10, 10, 10}, 0.5);
  EXPECT_NEAR(beta.data<float>()[0], -0.005f, 1e-8);
  EXPECT_THROW(bc.step(beta, std::vector<int64_t>{70, 10, 10, 10}, -1.0), Error);
  // A large eps turns the first step proportional: lr·g/(|g| + eps), so a 4x larger imbalance
  // moves its bias further (a sign-like step would move both by lr). g = 0.05 and 0.20 here.
  Tensor b2 = Tensor::zeros(Shape{1, E + 1}, DType::f32);
  BalanceController damped(1, E, 0.01, 0.9, 0.95, 0.1);
  damped.step(b2, std::vector<int64_t>{30, 45, 10, 15});  // p = 0.30, 0.45, 0.10, 0.15
  const float* b = b2.data<float>();
  EXPECT_NEAR(b[0], -0.01 * 0.05 / (0.05 + 0.1), 1e-7);  // float math on ~1e-3 values: 1e-7 slack
  EXPECT_NEAR(b[1], -0.01 * 0.20 / (0.20 + 0.1), 1e-7);
  EXPECT_NEAR(b[2], 0.01 * 0.15 / (0.15 + 0.1), 1e-7);
  EXPECT_NEAR(b[3], 0.01 * 0.10 / (0.10 + 0.1), 1e-7);
}

TEST(Balancer, DrivesSyntheticRouterTowardUniformLoads) {
  const int64_t N = 4000, E = 8;
  SyntheticRouter router(N, E, 5);
  Tensor beta = Tensor::zeros(Shape{1, E + 1}, DType::f32);
  beta.data<float>()[E] = -1.0f;
  BalanceController bc(1, E, 0.01, 0.9, 0.95, 1e-8);
  const double start = max_share(router.counts(beta));
  ASSERT_GT(start, 2.0 / E);  // clearly imbalanced to begin with (uniform would be 1/8)
  std::vector<int64_t> last_total(static_cast<size_t>(E), 0);
  for (int s = 0; s < 300; ++s) {
    std::vector<int64_t> c = router.counts(beta);
    bc.step(beta, c);
    if (s >= 250)
      for (int64_t e = 0; e < E; ++e) last_total[e] += c[e];
  }
  // AdamW moves each bias by ~lr per step, so loads settle within a band around 1/E rather than
  // exactly on it; averaged over the last 50 steps the largest share is within 25% of uniform,
  // and every expert is used (the skewed start left expert 0 nearly empty).
  double end = max_share(last_total);
  EXPECT_LT(end, 1.25 / E) << "start " << start;
  for (int64_t e = 0; e < E; ++e) EXPECT_GT(last_total[e], 0) << "expert " << e;
  EXPECT_EQ(beta.data<float>()[E], -1.0f);
}

struct RunResult {
  std::vector<double> losses;
  Vec params, beta;
};

// Trains a tiny model on one fixed batch for `steps` optimizer steps with the run's schedule,
// optionally starting from a saved (params, β, optimizer state) and stopping early to save one.
struct Saved {
  Vec params, beta;
  std::map<std::string, Tensor> state;
};

RunResult train(const OptimizerConfig& cfg, int from, int to, const Saved* resume, Saved* save_at_end) {
  model::ModelConfig mc = test::tiny_config();
  const int64_t B = 2, T = 16;
  model::ZayaModel m(mc, B, T);
  m.init(42);
  Optimizer opt(cfg, ParamTable::of(m));
  if (resume) {
    std::memcpy(m.params_flat().data<float>(),
                std::vector<float>(resume->params.begin(), resume->params.end()).data(),
                resume->params.size() * 4);
    std::vector<float> b(resume->beta.begin(), resume->beta.end());
    std::memcpy(m.balancing_biases().data<float>(), b.data(), b.size() * 4);
    opt.load_state(resume->state);
  }
  test::Batch batch = test::make_batch(mc.vocab_size, B, T, 7);
  RunResult r;
  for (int s = from; s < to; ++s) {
    r.losses.push_back(m.forward(batch.tid, batch.ttg, true));
    m.backward();
    std::vector<int64_t> counts;
    m.add_expert_counts(counts);
    StepStats st = opt.step(lr_at(cfg, opt.steps() + 1));
    EXPECT_FALSE(st.skipped);
    opt.balance_step(counts, st.lr);
  }
  r.params = to_f64(m.params_flat());
  r.beta = to_f64(m.balancing_biases());
  if (save_at_end) {
    save_at_end->params = r.params;
    save_at_end->beta = r.beta;
    for (auto& [n, t] : opt.state_tensors()) save_at_end->state[n] = t.clone();
  }
  return r;
}

OptimizerConfig train_config(bool muon) {
  OptimizerConfig c;
  c.muon = muon;
  c.muon_min_dim = 16;  // the tiny model's 16-wide matrices go to Muon too, so Muon does the work
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  c.warmup_steps = 3;
  c.total_steps = 30;
  c.decay_fraction = 0.2;
  c.weight_decay = 0.01;
  c.grad_clip = 1.0;
  c.balance_lr = 1e-3;
  return c;
}

class Overfit : public ::testing::TestWithParam<bool> {};

TEST_P(Overfit, LossFallsSubstantiallyOnAFixedBatch) {
  OptimizerConfig cfg = train_config(GetParam());
  RunResult a = train(cfg, 0, 30, nullptr, nullptr);
  // Start near ln(32) ≈ 3.47 (uniform prediction over the tiny vocabulary); 30 steps on the same
  // 30 predicted tokens memorize them: measured 3.41 -> 0.07 (Muon) and -> 0.05 (AdamW). Requiring
  // a 5x drop leaves a wide margin for other thread counts while a broken update fails it.
  std::printf("[ overfit  ] %s: loss %.4f -> %.4f after 30 steps\n", GetParam() ? "muon" : "adamw",
              a.losses.front(), a.losses.back());
  EXPECT_GT(a.losses.front(), 3.0);
  EXPECT_LT(a.losses.back(), 0.2 * a.losses.front())
      << "first " << a.losses.front() << " last " << a.losses.back();
  // Determinism: the same run again is bitwise identical.
  RunResult b = train(cfg, 0, 30, nullptr, nullptr);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.beta, b.beta);
}

INSTANTIATE_TEST_SUITE_P(MuonOnOff, Overfit, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Muon" : "AdamWOnly"; });

TEST(Optimizer, ResumeFromStateTensorsIsBitExact) {
  OptimizerConfig cfg = train_config(true);
  RunResult full = train(cfg, 0, 20, nullptr, nullptr);
  Saved mid;
  RunResult first = train(cfg, 0, 10, nullptr, &mid);
  ASSERT_EQ(mid.state.at("optim.step").data<int64_t>()[0], 10);
  RunResult second = train(cfg, 10, 20, &mid, nullptr);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, full.losses);
  EXPECT_EQ(second.params, full.params);
  EXPECT_EQ(second.beta, full.beta);
}

// Optimizer::step runs Muon's matrices side by side, one whole matrix per thread (an expert stack's
// matrices one by one). Each matrix's result must not depend on the thread that runs it: one step
// from the same gradients gives the same bits on 1, 2 and 3 threads. And every matrix must get its
// update: against muon_update_stack called per parameter (the batched path, f32 Newton–Schulz),
// the parameters agree to 1e-5 of the update's norm (f32 rounding through five quintic steps;
// a skipped or doubled matrix is off by the whole update).
TEST(Optimizer, MuonMatricesSideBySideAreThreadCountFreeAndComplete) {
  model::ModelConfig mc = test::tiny_config();
  model::ZayaModel m(mc, 2, 16);
  m.init(42);
  test::Batch batch = test::make_batch(mc.vocab_size, 2, 16, 7);
  m.forward(batch.tid, batch.ttg, true);
  m.backward();
  const Tensor p0 = m.params_flat().clone(), g0 = m.grads_flat().clone();
  auto restore = [&] {
    std::memcpy(m.params_flat().data<float>(), p0.data<float>(), p0.nbytes());
    std::memcpy(m.grads_flat().data<float>(), g0.data<float>(), g0.nbytes());
  };
  const int saved_threads = num_threads();
  for (bool bf16 : {true, false}) {
    OptimizerConfig cfg = train_config(true);
    cfg.muon_ns_bf16 = bf16;
    cfg.grad_clip = 0;  // the reference below does not clip
    std::vector<Vec> after;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      restore();
      Optimizer opt(cfg, ParamTable::of(m));
      opt.step(1e-2);
      after.push_back(to_f64(m.params_flat()));
    }
    // More threads than Muon matrices: one all-thread call per parameter instead, from an
    // optimizer built on one thread (its scratch must grow for that path).
    restore();
    set_num_threads(1);
    Optimizer built_on_one(cfg, ParamTable::of(m));
    const int many = static_cast<int>(built_on_one.summary().muon_matrices) + 1;
    set_num_threads(many);
    built_on_one.step(1e-2);
    const Vec batched = to_f64(m.params_flat());
    set_num_threads(saved_threads);
    EXPECT_EQ(after[0], after[1]) << (bf16 ? "bf16" : "f32") << ": 1 vs 2 threads";
    EXPECT_EQ(after[0], after[2]) << (bf16 ? "bf16" : "f32") << ": 1 vs 3 threads";
    if (bf16) continue;
    // The reference: every Muon parameter through muon_update_stack, from the same state.
    restore();
    Optimizer opt(cfg, ParamTable::of(m));  // for the grouping only
    MuonHyper hp;
    hp.lr = 1e-2f;
    hp.momentum = static_cast<float>(cfg.muon_momentum);
    hp.ns_steps = static_cast<int>(cfg.muon_ns_steps);
    hp.ns_dtype = DType::f32;
    double diff = 0, update = 0;
    int muon_params = 0;
    for (int i = 0; i < static_cast<int>(m.specs().size()); ++i) {
      const ParamGroup& g = opt.group(i);
      if (g.group != Group::muon) continue;
      ++muon_params;
      hp.weight_decay = g.weight_decay ? static_cast<float>(cfg.weight_decay) : 0.0f;
      Tensor p = m.param(i), mom = Tensor::zeros(p.shape(), DType::f32);
      Tensor scratch =
          Tensor::zeros(Shape{muon_scratch_elems(g.rows, g.cols, g.count, DType::f32)}, DType::f32);
      muon_update_stack(p, m.grad(i), mom, scratch, hp);
      const int64_t off = p.data<float>() - m.params_flat().data<float>();
      for (int64_t k = 0; k < p.numel(); ++k) {
        const double ref = p.data<float>()[k], got = after[0][static_cast<size_t>(off + k)];
        const double start = p0.data<float>()[off + k];
        diff += (got - ref) * (got - ref);
        update += (ref - start) * (ref - start);
      }
    }
    ASSERT_GT(muon_params, 4);
    ASSERT_GT(update, 0.0);
    EXPECT_LT(std::sqrt(diff / update), 1e-5);
    double diff_batched = 0;
    for (size_t k = 0; k < batched.size(); ++k)
      diff_batched += (batched[k] - after[0][k]) * (batched[k] - after[0][k]);
    EXPECT_LT(std::sqrt(diff_batched / update), 1e-5) << "on " << many << " threads (batched path)";
  }
}

TEST(Optimizer, StateNamesAndLoadErrors) {
  model::ZayaModel m(test::tiny_config(), 1, 4);
  m.init(1);
  OptimizerConfig cfg = train_config(true);
  Optimizer opt(cfg, ParamTable::of(m));
  std::map<std::string, Tensor> st;
  for (auto& [n, t] : opt.state_tensors()) st[n] = t.clone();
  EXPECT_TRUE(st.count("model.layers.0.self_attn.qkv_proj.q_proj.weight.muon_momentum"));
  EXPECT_TRUE(st.count("model.layers.1.mlp.experts.gate_up_proj.muon_momentum"));
  EXPECT_TRUE(st.count("model.embed_tokens.weight.adam_m"));
  EXPECT_TRUE(st.count("model.embed_tokens.weight.adam_v"));
  EXPECT_TRUE(st.count("model.layers.1.mlp.gate.balancing_biases.adam_v"));
  EXPECT_FALSE(st.count("model.layers.0.self_attn.qkv_proj.q_proj.weight.adam_v"));  // Muon: no v
  // A checkpoint written with Muon off lacks the momentum tensors: the error names one.
  OptimizerConfig off = cfg;
  off.muon = false;
  Optimizer adam_only(off, ParamTable::of(m));
  try {
    adam_only.load_state(st);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".adam_"), std::string::npos) << e.what();
  }
  // Wrong shape: named, and nothing is copied.
  std::map<std::string, Tensor> bad = st;
  bad["model.norm.weight.adam_m"] = Tensor::zeros(Shape{3}, DType::f32);
  EXPECT_THROW(opt.load_state(bad), Error);
  // The extra model tensors a checkpoint also holds are ignored.
  st["model.norm.weight"] = m.param("model.norm.weight").clone();
  EXPECT_NO_THROW(opt.load_state(st));
}

}  // namespace
}  // namespace zaya::optim
