// LR schedules at their key steps, the batch ramp, the recipe's phase lookup, [optim]/[recipe]
// parsing and validation errors, and the Muon/AdamW grouping rule.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/model/params.h"
#include "zaya/optim/config.h"
#include "zaya/optim/grouping.h"
#include "zaya/optim/schedule.h"

namespace zaya::optim {
namespace {

// Every expected value below is exact arithmetic on small integers and powers of two or a single
// libm call, so 1e-12 relative only absorbs double rounding.
constexpr double kTol = 1e-12;

OptimizerConfig sched(ScheduleKind k) {
  OptimizerConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  c.total_steps = 100;
  c.schedule = k;
  c.decay_fraction = 0.2;  // decay starts after step 80
  return c;
}

TEST(Schedule, WarmupIsLinearFromAboveZero) {
  OptimizerConfig c = sched(ScheduleKind::wsd);
  EXPECT_NEAR(lr_at(c, 1), 0.1, kTol);
  EXPECT_NEAR(lr_at(c, 5), 0.5, kTol);
  EXPECT_NEAR(lr_at(c, 10), 1.0, kTol);  // warmup end: the peak
  EXPECT_THROW(lr_at(c, 0), Error);
}

TEST(Schedule, WsdLinearAndOneMinusSqrt) {
  OptimizerConfig c = sched(ScheduleKind::wsd);
  EXPECT_NEAR(lr_at(c, 11), 1.0, kTol);
  EXPECT_NEAR(lr_at(c, 80), 1.0, kTol);               // decay start: still the peak
  EXPECT_NEAR(lr_at(c, 85), 0.1 + 0.9 * 0.75, kTol);  // x = 5/20
  EXPECT_NEAR(lr_at(c, 90), 0.1 + 0.9 * 0.5, kTol);
  EXPECT_NEAR(lr_at(c, 100), 0.1, kTol);  // end: min_lr
  EXPECT_NEAR(lr_at(c, 250), 0.1, kTol);  // past the end
  c.decay_shape = DecayShape::one_minus_sqrt;
  EXPECT_NEAR(lr_at(c, 85), 0.1 + 0.9 * 0.5, kTol);  // 1 − √(1/4)
  EXPECT_NEAR(lr_at(c, 80), 1.0, kTol);
  EXPECT_NEAR(lr_at(c, 100), 0.1, kTol);
}

TEST(Schedule, CosineAndConstant) {
  OptimizerConfig c = sched(ScheduleKind::cosine);
  EXPECT_NEAR(lr_at(c, 10), 1.0, kTol);
  EXPECT_NEAR(lr_at(c, 55), 0.1 + 0.9 * 0.5, kTol);  // halfway through the 90 cosine steps
  EXPECT_NEAR(lr_at(c, 100), 0.1, kTol);
  EXPECT_GT(lr_at(c, 30), lr_at(c, 31));  // decreasing
  c.schedule = ScheduleKind::constant;
  EXPECT_NEAR(lr_at(c, 3), 0.3, kTol);
  EXPECT_NEAR(lr_at(c, 99), 1.0, kTol);
  EXPECT_NEAR(lr_at(c, 1000), 1.0, kTol);
}

TEST(Schedule, NoWarmup) {
  OptimizerConfig c = sched(ScheduleKind::wsd);
  c.warmup_steps = 0;
  EXPECT_NEAR(lr_at(c, 1), 1.0, kTol);
}

TEST(BatchRamp, LinearInMicroMultiples) {
  BatchRamp r{.start = 8, .full = 64, .tokens = 1000, .micro = 8};
  r.validate("test");
  EXPECT_EQ(r.batch_at(0), 8);
  EXPECT_EQ(r.batch_at(500), 32);  // 8 + 0.5·56 = 36 → 32
  EXPECT_EQ(r.batch_at(999), 56);  // 63.94 → 56
  EXPECT_EQ(r.batch_at(1000), 64);
  EXPECT_EQ(r.batch_at(1 << 30), 64);
  for (int64_t t = 0; t < 1200; t += 37) {
    EXPECT_EQ(r.batch_at(t) % 8, 0);
    EXPECT_LE(r.batch_at(t), r.batch_at(t + 37));  // never shrinks
  }
  BatchRamp bad{.start = 8, .full = 60, .tokens = 10, .micro = 8};
  EXPECT_THROW(bad.validate("test"), Error);
}

const char* kRecipe = R"(
[recipe]
batch_ramp_start = 4
batch_ramp_tokens = 1000

[[recipe.phases]]
name = "web"
tokens = 1000
seq_len = 4096
rope_theta = 10000.0
data_weights = [0.8, 0.2]
batch_size = 16

[[recipe.phases]]
name = "code-math"
tokens = 500
seq_len = 4096
data_weights = [0.3, 0.7]
batch_size = 16

[[recipe.phases]]
name = "long-context"
tokens = 200
seq_len = 32768
rope_theta = 1e6
batch_size = 2
)";

TEST(Recipe, ParsesPhasesAndMapsTokensToPhases) {
  ConfigReader r = ConfigReader::from_string(kRecipe, "recipe.toml");
  Recipe rec = Recipe::from_toml(r);
  r.finish();
  ASSERT_EQ(rec.phases.size(), 3u);
  EXPECT_EQ(rec.phases[1].name, "code-math");
  EXPECT_EQ(rec.phases[2].seq_len, 32768);
  EXPECT_EQ(rec.phases[2].rope_theta, 1e6);
  EXPECT_EQ(rec.phases[0].data_weights, (std::vector<double>{0.8, 0.2}));
  EXPECT_EQ(rec.total_tokens(), 1700);
  EXPECT_EQ(rec.phase_at(0), 0);
  EXPECT_EQ(rec.phase_at(999), 0);
  EXPECT_EQ(rec.phase_at(1000), 1);
  EXPECT_EQ(rec.phase_at(1499), 1);
  EXPECT_EQ(rec.phase_at(1500), 2);
  EXPECT_EQ(rec.phase_at(5000), 2);  // done: stays in the last phase
  EXPECT_EQ(rec.phase_start(2), 1500);
  BatchRamp ramp = rec.batch_ramp(4);
  EXPECT_EQ(ramp.batch_at(0), 4);
  EXPECT_EQ(ramp.batch_at(1000), 16);
}

TEST(Recipe, RejectsBadPhasesNamingTheKey) {
  std::string text = kRecipe;
  text.replace(text.find("seq_len = 32768"), 15, "seq_len = -1");
  ConfigReader r = ConfigReader::from_string(text, "recipe.toml");
  try {
    Recipe::from_toml(r);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recipe.phases[2].seq_len"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("recipe.toml"), std::string::npos) << e.what();
  }
  ConfigReader missing = ConfigReader::from_string("[[recipe.phases]]\ntokens = 5\nseq_len = 8\n", "m.toml");
  EXPECT_THROW(Recipe::from_toml(missing), Error);  // batch_size is required
}

TEST(Recipe, StepsNeverStraddlePhases) {
  // Micro 4. Phase 0: 1000 tokens, batch 16 x 16 = 256 tokens a step, ramped from 4 over 500:
  // consumed 0 -> batch 4 (64 tok), 64 -> 4 + 12·64/500 = 5.5 -> 4, 128 -> 7.1 -> 4, 192 -> 8.6 -> 8
  // (128 tok), 320 -> 11.7 -> 8, 448 -> 14.8 -> 12 (192 tok), 640 (ramp done) -> 16 (256 tok),
  // 896 -> 16: this step starts in phase 0 and runs to 1152, past its end at 1000.
  // Phase 1 = [1000, 1500): 1152 -> 8 x 64 = 512 -> 1664, done. θ absent: 0 (the model's).
  ConfigReader r = ConfigReader::from_string(R"(
[recipe]
batch_ramp_start = 4
batch_ramp_tokens = 500
[[recipe.phases]]
tokens = 1000
seq_len = 16
batch_size = 16
[[recipe.phases]]
tokens = 500
seq_len = 64
batch_size = 8
)", "r.toml");
  Recipe rec = Recipe::from_toml(r);
  r.finish();
  EXPECT_EQ(rec.phases[0].name, "phase0");
  EXPECT_EQ(rec.phases[1].rope_theta, 0.0);
  const std::vector<int64_t> batches = {4, 4, 4, 8, 8, 12, 16, 16, 8};
  int64_t consumed = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    RecipeStep st = rec.step_at(consumed, 4);
    EXPECT_EQ(st.batch_size, batches[i]) << "step " << i + 1;
    EXPECT_EQ(st.phase, i + 1 < batches.size() ? 0 : 1) << "step " << i + 1;
    EXPECT_EQ(st.seq_len, i + 1 < batches.size() ? 16 : 64) << "step " << i + 1;
    consumed += st.tokens();
  }
  EXPECT_EQ(consumed, 1664);
  EXPECT_EQ(rec.num_steps(4), static_cast<int64_t>(batches.size()));
  // An explicit θ must be positive (0 would silently mean "the model's").
  ConfigReader zero = ConfigReader::from_string("[[recipe.phases]]\ntokens = 5\nseq_len = 8\nbatch_size = 4\nrope_theta = 0\n",
                                                "z.toml");
  EXPECT_THROW(Recipe::from_toml(zero), Error);
}

// Token counts whose sums overflow int64 (undefined behaviour that also made the step count loop
// forever) are errors naming the key. Found by tests/fuzz/fuzz_run_config under UBSan.
TEST(Recipe, RejectsTokenCountsThatOverflow) {
  const auto error_of = [](const std::string& text) -> std::string {
    ConfigReader r = ConfigReader::from_string(text, "big.toml");
    try {
      Recipe::from_toml(r);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string max = "9223372036854775807";
  // Each phase alone fits (2^62 tokens), their sum does not.
  const std::string phase = "[[recipe.phases]]\ntokens = 4611686018427387904\nseq_len = 1\nbatch_size = 1\n";
  std::string e = error_of(phase + phase);
  EXPECT_NE(e.find("recipe.phases[1].tokens"), std::string::npos) << e;
  // One phase at the limit: the last step would overshoot past it.
  e = error_of("[[recipe.phases]]\ntokens = " + max + "\nseq_len = 2\nbatch_size = 1\n");
  EXPECT_NE(e.find("recipe.phases[0].tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("9223372036854775805"), std::string::npos) << e;  // the most it may be
  e = error_of("[[recipe.phases]]\ntokens = 100\nseq_len = 4096\nbatch_size = 4611686018427387904\n");
  EXPECT_NE(e.find("recipe.phases[0].batch_size"), std::string::npos) << e;
  // The largest totals that fit are accepted.
  EXPECT_EQ(error_of("[[recipe.phases]]\ntokens = 9223372036854775805\nseq_len = 2\nbatch_size = 1\n"), "");
}

TEST(OptimConfig, ReadsEveryKey) {
  ConfigReader r = ConfigReader::from_string(R"(
[optim]
lr = 3e-4
min_lr = 3e-5
warmup_steps = 50
schedule = "cosine"
decay_fraction = 0.1
decay_shape = "1-sqrt"
total_steps = 500
weight_decay = 0.05
beta1 = 0.8
beta2 = 0.99
eps = 1e-10
grad_clip = 0.0
muon = false
muon_momentum = 0.9
muon_ns_steps = 6
muon_min_dim = 64
muon_exclude = ["o_proj"]
balance_enabled = false
balance_lr = 1e-2
)",
                                             "run.toml");
  OptimizerConfig c = OptimizerConfig::from_toml(r);
  r.finish();
  EXPECT_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.min_lr, 3e-5);
  EXPECT_EQ(c.warmup_steps, 50);
  EXPECT_EQ(c.schedule, ScheduleKind::cosine);
  EXPECT_EQ(c.decay_shape, DecayShape::one_minus_sqrt);
  EXPECT_EQ(c.total_steps, 500);
  EXPECT_EQ(c.weight_decay, 0.05);
  EXPECT_EQ(c.beta1, 0.8);
  EXPECT_EQ(c.beta2, 0.99);
  EXPECT_EQ(c.eps, 1e-10);
  EXPECT_EQ(c.grad_clip, 0.0);
  EXPECT_FALSE(c.muon);
  EXPECT_EQ(c.muon_momentum, 0.9);
  EXPECT_EQ(c.muon_ns_steps, 6);
  EXPECT_EQ(c.muon_min_dim, 64);
  EXPECT_EQ(c.muon_exclude, std::vector<std::string>{"o_proj"});
  EXPECT_FALSE(c.balance_enabled);
  EXPECT_EQ(c.balance_lr, 1e-2);
}

void expect_error_names(const std::string& toml, const std::string& key) {
  ConfigReader r = ConfigReader::from_string(toml, "bad.toml");
  try {
    OptimizerConfig::from_toml(r);
    FAIL() << "expected an error for " << key;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.toml"), std::string::npos) << e.what();
  }
}

TEST(OptimConfig, ErrorsNameTheKey) {
  expect_error_names("[optim]\nschedule = \"linear\"\n", "optim.schedule");
  expect_error_names("[optim]\ndecay_shape = \"sqrt\"\n", "optim.decay_shape");
  expect_error_names("[optim]\nlr = -1.0\n", "optim.lr");
  expect_error_names("[optim]\nbeta2 = 1.0\n", "optim.beta2");
  expect_error_names("[optim]\nwarmup_steps = 2000\n", "optim.warmup_steps");  // > total_steps
  expect_error_names("[optim]\nwarmup_steps = 900\ndecay_fraction = 0.2\n", "optim.decay_fraction");
  expect_error_names("[optim]\nmuon_ns_steps = 0\n", "optim.muon_ns_steps");
  expect_error_names("[optim]\nmin_lr = 1.0\n", "optim.min_lr");  // above lr
  expect_error_names("[optim]\nmuon = 1\n", "optim.muon");        // wrong type (ConfigReader)
  ConfigReader r = ConfigReader::from_string("[optim]\nlearning_rate = 1.0\n", "typo.toml");
  OptimizerConfig::from_toml(r);
  EXPECT_THROW(r.finish(), Error);  // unknown keys are the caller's finish()
}

// The grouping rule on the default (demo) shapes and on ZAYA1-base shapes.
TEST(Grouping, DemoConfigSplit) {
  model::ModelConfig mc;  // defaults: H 256, R 64, E 8 (+ skip): the demo model
  OptimizerConfig c;
  for (const model::ParamSpec& s : model::parameter_specs(mc)) {
    ParamGroup g = group_of(s, c);
    const std::string& n = s.name;
    auto has = [&](const char* sub) { return n.find(sub) != std::string::npos; };
    if (has(".q_proj.") || has(".k_proj.") || has(".v_proj_") || has(".o_proj.") || has("down_proj.weight") ||
        has("fc1.weight") || has("fc2.weight")) {
      EXPECT_EQ(g.group, Group::muon) << n;
      EXPECT_EQ(g.count, 1) << n;
      EXPECT_TRUE(g.weight_decay) << n;
    } else if (has("mlp.experts.")) {
      EXPECT_EQ(g.group, Group::muon) << n;
      EXPECT_EQ(g.count, mc.num_experts) << n;  // each expert its own matrix
      EXPECT_EQ(g.rows, s.shape[1]) << n;
      EXPECT_TRUE(g.weight_decay) << n;
    } else if (has("out_proj")) {
      EXPECT_EQ(g.group, Group::adamw) << n;  // [E+1 = 9, R]: 9 < 32
      EXPECT_TRUE(g.weight_decay) << n;
    } else if (has("embed_tokens")) {
      EXPECT_EQ(g.group, Group::adamw) << n;
      EXPECT_TRUE(g.weight_decay) << n;
    } else {
      // Norms, scales, biases, temperatures, conv kernels.
      EXPECT_EQ(g.group, Group::adamw) << n;
      EXPECT_FALSE(g.weight_decay) << n;
    }
  }
  GroupSummary sum = summarize_groups(model::parameter_specs(mc), c);
  model::ParamCounts pc = model::count_parameters(mc);
  EXPECT_EQ(sum.muon_params + sum.adamw_params, pc.total);
  EXPECT_EQ(sum.decay_params + sum.no_decay_params, pc.total);
  // Per layer: q, k, v_cur, v_del, o, down_proj, fc1, fc2 (8 tensors) and 2 expert stacks.
  EXPECT_EQ(sum.muon_tensors, 10 * mc.num_hidden_layers);
  EXPECT_EQ(sum.muon_matrices, (8 + 2 * mc.num_experts) * mc.num_hidden_layers);
  EXPECT_NE(sum.str().find("muon"), std::string::npos);

  // The one switch: muon = false puts everything on AdamW, decay unchanged.
  c.muon = false;
  GroupSummary off = summarize_groups(model::parameter_specs(mc), c);
  EXPECT_EQ(off.muon_tensors, 0);
  EXPECT_EQ(off.adamw_params, pc.total);
  EXPECT_EQ(off.decay_params, sum.decay_params);
}

TEST(Grouping, SmallRouterAndExclusionsGoToAdamW) {
  model::ModelConfig mc;
  mc.router_hidden_size = 16;  // R < 32: the whole router MLP is small
  OptimizerConfig c;
  c.muon_exclude = {"o_proj"};
  for (const model::ParamSpec& s : model::parameter_specs(mc)) {
    ParamGroup g = group_of(s, c);
    if (s.name.find("mlp.gate.") != std::string::npos || s.name.find("o_proj") != std::string::npos) {
      EXPECT_EQ(g.group, Group::adamw) << s.name;
    }
    if (s.name.find("q_proj") != std::string::npos) {
      EXPECT_EQ(g.group, Group::muon) << s.name;
    }
    if (s.name.find("mlp.gate.router_mlp.fc1.weight") != std::string::npos) {
      EXPECT_TRUE(g.weight_decay);  // small matrices still decay, on AdamW
    }
  }
  // ZAYA1-base: R = 256 puts down_proj/fc1/fc2 on Muon, out_proj [17, 256] stays on AdamW.
  model::ModelConfig base;
  base.router_hidden_size = 256;
  base.num_experts = 16;
  for (const model::ParamSpec& s : model::parameter_specs(base)) {
    if (s.layer != 0) continue;
    if (s.name.find("fc1.weight") != std::string::npos) {
      EXPECT_EQ(group_of(s, OptimizerConfig{}).group, Group::muon);
    }
    if (s.name.find("out_proj") != std::string::npos) {
      EXPECT_EQ(group_of(s, OptimizerConfig{}).group, Group::adamw);
    }
  }
}

}  // namespace
}  // namespace zaya::optim
