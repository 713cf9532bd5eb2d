// Update rules against float64 references written again here: AdamW through the Optimizer over
// several steps (weight decay on/off per the grouping rule), Muon of one matrix (momentum,
// Nesterov, Newton–Schulz with the transpose for tall matrices, RMS scale, weight decay), expert
// stacks orthogonalized per expert, and global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "ops/gradcheck.h"
#include "optim/tiny.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/optim_ops.h"
#include "zaya/optim/muon.h"
#include "zaya/optim/optimizer.h"

namespace zaya::optim {
namespace {

using Vec = std::vector<double>;
using zaya::test::random_tensor;
using zaya::test::to_f64;

// Fills every gradient of the model with fresh normal values (a different draw per step).
void random_grads(model::ZayaModel& m, uint64_t seed) {
  Tensor g = m.grads_flat();
  fill_normal(g, seed, 0, 0.0f, 0.5f);
}

std::map<std::string, Tensor> state_map(Optimizer& opt) {
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : opt.state_tensors()) out[n] = t;
  return out;
}

TEST(AdamW, MatchesDoubleReferenceOverSeveralSteps) {
  model::ModelConfig mc = test::tiny_config();
  model::ZayaModel m(mc, 1, 4);
  m.init(3);
  OptimizerConfig cfg;
  cfg.muon = false;  // everything on AdamW
  cfg.grad_clip = 0;
  cfg.weight_decay = 0.1;
  Optimizer opt(cfg, ParamTable::of(m));

  const int64_t P = m.params_flat().numel();
  Vec p = to_f64(m.params_flat()), mm(P, 0.0), vv(P, 0.0);
  // The decay mask, derived here from roles independently of the optimizer's rule.
  Vec decay(P, 0.0);
  int64_t off = 0;
  for (const model::ParamSpec& s : m.specs()) {
    bool d = s.role == model::ParamRole::matrix || s.role == model::ParamRole::expert_matrix ||
             s.role == model::ParamRole::embedding;
    for (int64_t i = 0; i < s.shape.numel(); ++i) decay[off + i] = d ? 1.0 : 0.0;
    off += s.shape.numel();
  }
  const double lrs[] = {1e-2, 5e-3, 2e-2, 1e-3};
  for (int t = 1; t <= 4; ++t) {
    random_grads(m, 100 + t);
    Vec g = to_f64(m.grads_flat());
    StepStats s = opt.step(lrs[t - 1]);
    EXPECT_EQ(s.step, t);
    double lr = lrs[t - 1], b1 = cfg.beta1, b2 = cfg.beta2;
    for (int64_t i = 0; i < P; ++i) {
      mm[i] = b1 * mm[i] + (1 - b1) * g[i];
      vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
      double mh = mm[i] / (1 - std::pow(b1, t)), vh = vv[i] / (1 - std::pow(b2, t));
      p[i] -= lr * (mh / (std::sqrt(vh) + cfg.eps) + cfg.weight_decay * decay[i] * p[i]);
    }
  }
  // p is stored in f32: each step rounds it to an ulp of |p| <= ~1 (1.2e-7), and the update
  // m̂/(√v̂+eps)·lr adds a few ulps of lr. Measured 1.6e-7 after four steps; 1e-6 leaves a margin
  // and still catches any wrong term (a missing bias correction or decay moves p by >= 1e-4).
  EXPECT_LT(zaya::test::max_abs_diff(to_f64(m.params_flat()), p), 1e-6);
  EXPECT_EQ(to_f64(m.grads_flat()), Vec(P, 0.0));  // step() zeroes the gradients
}

// Double reference of one Muon step on an r×c matrix.
void muon_reference(Vec& p, Vec& mom, const Vec& g, int64_t rows, int64_t cols, double lr, double beta,
                    double wd, int steps) {
  const int64_t n = rows * cols;
  Vec u(n);
  for (int64_t i = 0; i < n; ++i) {
    mom[i] = beta * mom[i] + g[i];
    u[i] = g[i] + beta * mom[i];
  }
  const bool tr = rows > cols;
  const int64_t r = tr ? cols : rows, c = tr ? rows : cols;
  double fro = 0;
  for (double x : u) fro += x * x;
  fro = std::sqrt(fro);
  Vec X(n);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) X[i * c + j] = (tr ? u[j * cols + i] : u[i * cols + j]) / (fro + 1e-7);
  for (int s = 0; s < steps; ++s) X = zaya::test::newton_schulz_step_f64(X, r, c);
  const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double o = tr ? X[j * c + i] : X[i * c + j];
      p[i * cols + j] -= lr * (wd * p[i * cols + j] + scale * o);
    }
}

class MuonShapes : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(MuonShapes, MatchesDoubleReferenceOverThreeSteps) {
  auto [rows, cols] = GetParam();
  Tensor p = random_tensor({rows, cols}, 1, 0.05f);
  Tensor mom = Tensor::zeros(Shape{rows, cols}, DType::f32);
  Tensor scratch = Tensor::zeros(Shape{muon_scratch_elems(rows, cols)}, DType::f32);
  Vec pr = to_f64(p), mr(rows * cols, 0.0);
  MuonHyper hp;
  hp.lr = 0.02f;
  hp.momentum = 0.95f;
  hp.weight_decay = 0.1f;
  for (int t = 0; t < 3; ++t) {
    Tensor g = random_tensor({rows, cols}, 10 + t);
    Vec gr = to_f64(g);
    Vec before = to_f64(p);
    muon_update(p, g, mom, scratch, hp);
    muon_reference(pr, mr, gr, rows, cols, hp.lr, hp.momentum, hp.weight_decay, 5);
    // Compare the step taken (p_new − p_old) rather than p, so the tolerance is relative to the
    // update. The quintic's slope at small singular values is a = 3.44, so f32 rounding (~1e-7)
    // can grow over five steps, and oneDNN's GEMMs sum in their own order; measured ~1e-6
    // relative. 2e-5 leaves a 20x margin while a wrong transpose, scale or momentum gives O(1).
    Vec step(rows * cols), step_ref(rows * cols);
    Vec now = to_f64(p);
    for (int64_t i = 0; i < rows * cols; ++i) step[i] = now[i] - before[i], step_ref[i] = pr[i] - before[i];
    EXPECT_LT(zaya::test::rel_error(step, step_ref), 2e-5) << "step " << t;
    pr = now;  // keep the reference on our trajectory so errors do not compound across steps
  }
  // The momentum is plain f32 arithmetic on the same inputs: a few ulps (measured 3e-8).
  EXPECT_LT(zaya::test::rel_error(mom, mr), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MuonShapes,
                         ::testing::Values(std::pair<int64_t, int64_t>{20, 48},    // wide
                                           std::pair<int64_t, int64_t>{48, 20},    // tall: transposed
                                           std::pair<int64_t, int64_t>{32, 32}));  // square

TEST(Muon, UpdateHasAdamWLikeRms) {
  // O ≈ U·Vᵀ has RMS 1/√max(r, c) when the gradient has full rank, so the scaled update has RMS
  // ≈ 0.2. The quintic leaves singular values in ~[0.7, 1.2], hence the wide band.
  const int64_t rows = 64, cols = 96;
  Tensor p = Tensor::zeros(Shape{rows, cols}, DType::f32);
  Tensor mom = Tensor::zeros(Shape{rows, cols}, DType::f32);
  Tensor scratch = Tensor::zeros(Shape{muon_scratch_elems(rows, cols)}, DType::f32);
  Tensor g = random_tensor({rows, cols}, 5);
  MuonHyper hp;
  hp.lr = 1.0f;
  muon_update(p, g, mom, scratch, hp);
  double ss = 0;
  for (double x : to_f64(p)) ss += x * x;
  double rms = std::sqrt(ss / static_cast<double>(rows * cols));
  EXPECT_GT(rms, 0.2 * 0.6);
  EXPECT_LT(rms, 0.2 * 1.25);
}

TEST(Muon, ExpertStackEqualsSeparateMatrices) {
  const int64_t E = 3, r = 24, c = 40;
  Tensor p = random_tensor({E, r, c}, 1, 0.05f), g = random_tensor({E, r, c}, 2);
  Tensor mom = random_tensor({E, r, c}, 3, 0.1f);
  Tensor p2 = p.clone(), g2 = g.clone(), mom2 = mom.clone();
  Tensor scratch = Tensor::zeros(Shape{muon_scratch_elems(r, c, E)}, DType::f32);
  MuonHyper hp;
  hp.lr = 0.05f;
  hp.weight_decay = 0.1f;
  muon_update_stack(p, g, mom, scratch, hp);
  for (int64_t e = 0; e < E; ++e) {
    Tensor pe = p2.select(e).clone(), ge = g2.select(e).clone(), me = mom2.select(e).clone();
    Tensor pe0 = pe.clone();
    muon_update(pe, ge, me, scratch, hp);
    // The momentum is element-wise: bitwise. The update goes through batched instead of single
    // GEMMs, whose blocking (and so rounding) may differ: the step p − p₀ agrees to f32 rounding
    // amplified by five quintic steps (~1e-6 relative); 1e-5 leaves margin.
    EXPECT_EQ(to_f64(me), to_f64(mom.select(e))) << "expert " << e;
    Vec step_single = to_f64(pe), step_stack = to_f64(p.select(e)), p0 = to_f64(pe0);
    for (size_t i = 0; i < p0.size(); ++i) {
      step_single[i] -= p0[i];
      step_stack[i] -= p0[i];
    }
    EXPECT_LT(zaya::test::max_abs_diff(step_single, step_stack),
              1e-5 * zaya::test::max_abs_diff(step_single, Vec(step_single.size(), 0.0)))
        << "expert " << e;
  }
  // And not what orthogonalizing the stacked [E·r, c] matrix would give.
  Tensor p3 = p2.reshape(Shape{E * r, c}).clone(), g3 = g2.reshape(Shape{E * r, c}).clone();
  Tensor m3 = mom2.reshape(Shape{E * r, c}).clone();
  Tensor scratch3 = Tensor::zeros(Shape{muon_scratch_elems(E * r, c)}, DType::f32);
  muon_update(p3, g3, m3, scratch3, hp);
  EXPECT_GT(zaya::test::max_abs_diff(to_f64(p3), to_f64(p)), 1e-4);
}

TEST(Muon, Bf16NewtonSchulzFollowsTheF32Update) {
  // bf16 GEMM inputs (Muon's reference precision) against the f32 iteration on the same momentum:
  // the quintic maps singular values into a band rather than to 1, so bf16 rounding (2^-8
  // relative per input) moves individual entries by a few percent but not the update's direction.
  // Bound: cosine similarity > 0.99 and an RMS within 3% of the f32 one (measured 0.9997 / 0.04%).
  const int64_t E = 4, r = 64, c = 96;
  Tensor p = random_tensor({E, r, c}, 4, 0.05f), g = random_tensor({E, r, c}, 5);
  Tensor mom = random_tensor({E, r, c}, 6, 0.1f);
  Tensor pf = p.clone(), gf = g.clone(), mf = mom.clone();
  MuonHyper hp;
  hp.lr = 0.02f;
  hp.ns_dtype = DType::bf16;
  Tensor s16 = Tensor::zeros(Shape{muon_scratch_elems(r, c, E, DType::bf16)}, DType::f32);
  muon_update_stack(p, g, mom, s16, hp);
  hp.ns_dtype = DType::f32;
  Tensor s32 = Tensor::zeros(Shape{muon_scratch_elems(r, c, E)}, DType::f32);
  muon_update_stack(pf, gf, mf, s32, hp);
  Vec p0 = to_f64(random_tensor({E, r, c}, 4, 0.05f)), d16 = to_f64(p), d32 = to_f64(pf);
  double dot = 0, n16 = 0, n32 = 0;
  for (size_t i = 0; i < p0.size(); ++i) {
    double a = d16[i] - p0[i], b = d32[i] - p0[i];
    dot += a * b;
    n16 += a * a;
    n32 += b * b;
  }
  EXPECT_GT(dot / std::sqrt(n16 * n32), 0.99);
  EXPECT_NEAR(std::sqrt(n16 / n32), 1.0, 0.03);
  EXPECT_THROW(muon_update_stack(p, g, mom, s32,
                                 [] {
                                   MuonHyper h;
                                   h.ns_dtype = DType::bf16;
                                   return h;
                                 }()),
               Error);  // an f32-sized scratch is too small for the bf16 copies
}

TEST(Muon, ShapeErrorsAreUserErrors) {
  Tensor p = Tensor::zeros(Shape{8, 8}, DType::f32), g = Tensor::zeros(Shape{8, 9}, DType::f32);
  Tensor m = Tensor::zeros(Shape{8, 8}, DType::f32), s = Tensor::zeros(Shape{4}, DType::f32);
  EXPECT_THROW(muon_update(p, g, m, Tensor::zeros(Shape{1000}, DType::f32), MuonHyper{}), Error);
  EXPECT_THROW(muon_update(p, p.clone(), m, s, MuonHyper{}), Error);  // scratch too small
}

TEST(Clipping, OptimizerClipsByGlobalNormAndReportsThePreClipNorm) {
  model::ZayaModel m(test::tiny_config(), 1, 4);
  m.init(1);
  OptimizerConfig cfg;
  cfg.muon = false;
  cfg.grad_clip = 0.5;
  Optimizer opt(cfg, ParamTable::of(m));
  random_grads(m, 9);
  Vec g = to_f64(m.grads_flat());
  double norm = 0;
  for (double x : g) norm += x * x;
  norm = std::sqrt(norm);
  ASSERT_GT(norm, 10 * cfg.grad_clip);
  StepStats s = opt.step(1e-3);
  // Squares summed in double: only the summation order differs from this loop.
  EXPECT_NEAR(s.grad_norm, norm, 1e-12 * norm);
  EXPECT_TRUE(s.clipped);
  // After step 1, adam_m = (1 − β1)·clipped g, so it reveals the clip factor.
  std::map<std::string, Tensor> st = state_map(opt);
  double coef = cfg.grad_clip / (norm + 1e-6);
  Tensor m_embed = st.at("model.embed_tokens.weight.adam_m");
  Vec ge(g.begin(), g.begin() + m_embed.numel());
  for (double& x : ge) x *= coef * (1 - cfg.beta1);
  // Two f32 multiplies (clip, 1−β1) and an add to 0: a few ulps.
  EXPECT_LT(zaya::test::rel_error(m_embed, ge), 1e-6);

  // Under the limit nothing is scaled.
  OptimizerConfig loose = cfg;
  loose.grad_clip = 10 * norm;
  Optimizer opt2(loose, ParamTable::of(m));
  random_grads(m, 9);
  EXPECT_FALSE(opt2.step(1e-3).clipped);
  Vec ge2(g.begin(), g.begin() + m_embed.numel());
  for (double& x : ge2) x *= (1 - cfg.beta1);
  EXPECT_LT(zaya::test::rel_error(state_map(opt2).at("model.embed_tokens.weight.adam_m"), ge2), 1e-6);
}

TEST(Optimizer, NonFiniteGradientSkipsTheStep) {
  model::ZayaModel m(test::tiny_config(), 1, 4);
  m.init(1);
  OptimizerConfig cfg;
  Optimizer opt(cfg, ParamTable::of(m));
  Vec before = to_f64(m.params_flat());
  random_grads(m, 2);
  m.grads_flat().data<float>()[17] = NAN;
  StepStats s = opt.step(1e-2);
  EXPECT_TRUE(s.skipped);
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(to_f64(m.params_flat()), before);
  EXPECT_EQ(to_f64(m.grads_flat()), Vec(before.size(), 0.0));
}

}  // namespace
}  // namespace zaya::optim
