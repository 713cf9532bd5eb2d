// The multi-phase recipe and the batch ramp in the trainer: [recipe] config errors, phase
// transitions at the right steps and tokens, the ramp's micro-batch counts, the data loader's
// continuation across phases, the model's RoPE-θ switch, and bit-exact resume inside and across
// phases. Tiny model, two tiny synthetic datasets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "train/toy.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/config.h"
#include "zaya/data/loader.h"
#include "zaya/model/zaya_model.h"
#include "zaya/train/model_io.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {
namespace fs = std::filesystem;
using toy::flat;

// Three phases with micro_batch 2: a ramp 2 -> 6 sequences over the first 256 tokens of "web"
// (seq 16), a mix change ("code-math", seq 16), then context extension (seq 32, θ 1e5, only the
// second dataset). Worked out by hand from BatchRamp::batch_at (b = 2 + 4·consumed/256 rounded
// down to a multiple of 2) and phase_at:
//   steps 1-4   batch 2 (consumed 0, 32, 64, 96: b = 2, 2.5, 3, 3.5 -> 2), 32 tokens each
//   steps 5-6   batch 4 (consumed 128, 192: b = 4, 5), 64 tokens each
//   steps 7-10  batch 6 (ramp done at 256), 96 tokens each -> 640 = the end of phase 0
//   steps 11-14 phase 1, batch 6 x 16 = 96 tokens -> 1024
//   steps 15-18 phase 2, batch 4 x 32 = 128 tokens -> 1536
const std::vector<int64_t> kBatches = {2, 2, 2, 2, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4};
const std::vector<int> kPhases = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
const int kSteps = 18;

std::string recipe_section() {
  return "[recipe]\nbatch_ramp_start = 2\nbatch_ramp_tokens = 256\n"
         "[[recipe.phases]]\nname = \"web\"\ntokens = 640\nseq_len = 16\nbatch_size = 6\n"
         "data_weights = [0.8, 0.2]\n"
         "[[recipe.phases]]\nname = \"code-math\"\ntokens = 384\nseq_len = 16\nbatch_size = 6\n"
         "data_weights = [0.2, 0.8]\n"
         "[[recipe.phases]]\nname = \"long\"\ntokens = 512\nseq_len = 32\nrope_theta = 1e5\nbatch_size = 4\n"
         "data_weights = [0.0, 1.0]\n";
}

class RecipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zaya_recipe_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    web_ = toy::make_corpus(root_ / "data", "web", 7, 4);
    code_ = toy::make_corpus(root_ / "data", "code", 11, 8);
  }
  void TearDown() override { fs::remove_all(root_); }
  // The run config text; `train_extra` goes into [train], `recipe` replaces the recipe.
  std::string text(const std::string& run, const std::string& train_extra = "",
                   const std::string& recipe = recipe_section()) {
    return toy::model_section() + "[data]\ntrain = [\"" + web_ + "\", \"" + code_ + "\"]\nval = \"" + web_ +
           "\"\n[train]\nmicro_batch = 2\neval_every = 0\neval_samples = 4\nprogress = false\nout_dir = \"" +
           (root_ / run).string() + "\"\n" + train_extra +
           "[optim]\nlr = 3e-3\nwarmup_steps = 5\nbalance_lr = 1e-3\n[ckpt]\nevery = 4\nkeep_last = 20\n" +
           recipe;
  }
  RunConfig config(const std::string& run) { return parse_run_config(text(run), "recipe.toml", {}); }
  std::string error(const std::string& toml, const std::vector<std::string>& overrides = {}) {
    try {
      parse_run_config(toml, "recipe.toml", overrides);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::vector<nlohmann::json> metrics(const std::string& run) {
    std::vector<nlohmann::json> out;
    std::ifstream in(root_ / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  fs::path root_;
  std::string web_, code_;
};

TEST_F(RecipeTest, ConfigDerivesTheRunLengthAndFillsRopeTheta) {
  RunConfig c = config("a");
  ASSERT_TRUE(c.has_recipe());
  EXPECT_EQ(c.train.steps, kSteps);        // the recipe decides the run length ...
  EXPECT_EQ(c.optim.total_steps, kSteps);  // ... and with it the LR schedule's
  EXPECT_EQ(c.train.seq_len, 16);
  EXPECT_EQ(c.recipe.phases[0].rope_theta, c.model.rope_theta);  // absent: the model's
  EXPECT_EQ(c.recipe.phases[2].rope_theta, 1e5);
  EXPECT_EQ(c.recipe.num_steps(2), kSteps);
  // An explicit shorter run is allowed (a smoke test: the schedule still spans the recipe); a
  // longer one is not.
  RunConfig smoke = parse_run_config(text("b", "steps = 3\n"), "recipe.toml", {});
  EXPECT_EQ(smoke.train.steps, 3);
  EXPECT_EQ(smoke.optim.total_steps, kSteps);
  // Without [recipe] nothing changes.
  RunConfig plain = parse_run_config(toy::toy_config(web_, root_ / "p", 7), "toy.toml", {});
  EXPECT_FALSE(plain.has_recipe());
  EXPECT_EQ(plain.train.steps, 7);
  EXPECT_EQ(plain.train.seq_len, 16);
}

TEST_F(RecipeTest, ConfigErrorsNameTheKeyAndFile) {
  auto expect_error = [&](const std::string& toml, const std::string& key, const std::string& word,
                          const std::vector<std::string>& overrides = {}) {
    std::string e = error(toml, overrides);
    EXPECT_NE(e.find(key), std::string::npos) << "expected '" << key << "' in: " << e;
    EXPECT_NE(e.find(word), std::string::npos) << "expected '" << word << "' in: " << e;
    EXPECT_NE(e.find("recipe.toml"), std::string::npos) << e;
  };
  std::string t = text("x");
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = t;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  expect_error(replaced("seq_len = 32", "seq_len = 128"), "recipe.phases[2].seq_len",
               "max_position_embeddings");
  expect_error(
      replaced("tokens = 384\nseq_len = 16\nbatch_size = 6", "tokens = 384\nseq_len = 16\nbatch_size = 5"),
      "recipe.phases[1].batch_size", "multiple of train.micro_batch");
  expect_error(replaced("data_weights = [0.2, 0.8]", "data_weights = [1.0]"), "recipe.phases[1].data_weights",
               "one weight per data.train entry");
  expect_error(replaced("data_weights = [0.0, 1.0]", "data_weights = [0.0, 0.0]"),
               "recipe.phases[2].data_weights", "positive");
  expect_error(replaced("tokens = 512", "tokens = 0"), "recipe.phases[2].tokens", "positive");
  expect_error(replaced("rope_theta = 1e5", "rope_theta = 0"), "recipe.phases[2].rope_theta", "positive");
  expect_error(replaced("batch_ramp_start = 2", "batch_ramp_start = 3"), "recipe.batch_ramp_start",
               "multiple");
  expect_error(replaced("batch_ramp_tokens = 256", "batch_ramp_tokens = 1000"), "recipe.batch_ramp_tokens",
               "phase 0");
  // Phase 1 shorter than phase 0's last step overshoots: it would never run.
  {
    // Phase 0's last step runs to token 640 (> 600), past all of phase 1 = [600, 630).
    std::string s = replaced("tokens = 640", "tokens = 600");
    s.replace(s.find("tokens = 384"), 12, "tokens = 30 ");
    expect_error(s, "recipe.phases[1].tokens", "at least one step");
  }
  expect_error(replaced("tokens = 384", "tokens = 384\nsequence_len = 16"),
               "unknown key 'recipe.phases[1].sequence_len'", "recipe.toml");
  expect_error(text("x", "seq_len = 16\n"), "train.seq_len", "each phase sets seq_len");
  expect_error(text("x", "grad_accum = 2\n"), "train.grad_accum", "batch_size");
  expect_error(text("x", "steps = 19\n"), "train.steps", "18 steps the recipe takes");
  expect_error(text("x", "", "[recipe]\nbatch_ramp_start = 2\n"), "recipe.phases", "at least one");
}

TEST_F(RecipeTest, TransitionsRampAndLogs) {
  Trainer tr(config("run"), {.quiet = true});
  TrainResult r = tr.run();
  ASSERT_EQ(r.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(r.batch_sizes, kBatches);
  EXPECT_EQ(r.phases, kPhases);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  // The model ends in the last phase's shape and RoPE θ.
  EXPECT_EQ(tr.model().seq_len(), 32);
  EXPECT_EQ(tr.model().config().rope_theta, 1e5);

  std::vector<nlohmann::json> phase_starts;
  int64_t step_records = 0, tokens = 0;
  for (const nlohmann::json& m : metrics("run")) {
    if (m.value("event", "") == "phase_start") {
      phase_starts.push_back(m);
    } else if (m.contains("loss")) {
      const size_t i = static_cast<size_t>(step_records++);
      EXPECT_EQ(m["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
      EXPECT_EQ(m["phase"].get<int>(), kPhases[i]) << "step " << i + 1;
      EXPECT_EQ(m["batch_size"].get<int64_t>(), kBatches[i]) << "step " << i + 1;
      tokens += kBatches[i] * m["seq_len"].get<int64_t>();
      EXPECT_EQ(m["tokens"].get<int64_t>(), tokens) << "step " << i + 1;
    }
  }
  EXPECT_EQ(step_records, kSteps);
  EXPECT_EQ(tokens, 1536);
  ASSERT_EQ(phase_starts.size(), 3u);
  const int64_t start_step[] = {1, 11, 15}, start_token[] = {0, 640, 1024}, seq[] = {16, 16, 32};
  for (int p = 0; p < 3; ++p) {
    const nlohmann::json& m = phase_starts[static_cast<size_t>(p)];
    EXPECT_EQ(m["phase"].get<int>(), p);
    EXPECT_EQ(m["step"].get<int64_t>(), start_step[p]);
    EXPECT_EQ(m["tokens"].get<int64_t>(), start_token[p]);
    EXPECT_EQ(m["seq_len"].get<int64_t>(), seq[p]);
  }
  EXPECT_EQ(phase_starts[0]["batch_size"].get<int64_t>(), 2);  // the ramp's first batch
  EXPECT_EQ(phase_starts[2]["rope_theta"].get<double>(), 1e5);
  EXPECT_EQ(phase_starts[1]["data_weights"].get<std::vector<double>>(), (std::vector<double>{0.2, 0.8}));

  // Data continuation. Phase 0 read 4·2 + 2·4 + 4·6 = 40 samples; phase 1 has the same seq_len, so
  // each dataset continues at its count (the offsets add up to 40 and follow phase 0's 0.8/0.2).
  auto offsets = [&](int p) {
    return phase_starts[static_cast<size_t>(p)]["data_offsets"].get<std::vector<int64_t>>();
  };
  EXPECT_EQ(offsets(0), (std::vector<int64_t>{0, 0}));
  const std::vector<int64_t> after0 =
      data::DataLoader({{web_, 0.8}, {code_, 0.2}}, 16, 1234).dataset_counts(40);  // data.seed 1234
  EXPECT_EQ(after0[0] + after0[1], 40);
  EXPECT_EQ(offsets(1), after0);
  // Phase 2 packs 32-token samples: both datasets were read in epoch 0, so both start epoch 1.
  data::DataLoader at32({{web_, 1.0}, {code_, 1.0}}, 32, 1234);
  EXPECT_EQ(offsets(2), (std::vector<int64_t>{at32.samples_per_epoch(0), at32.samples_per_epoch(1)}));
  // The checkpoint records the model's current RoPE θ and sequence length (for eval/export).
  ckpt::Checkpoint last(root_ / "run");
  EXPECT_EQ(checkpoint_model_config(last).rope_theta, 1e5);
  EXPECT_EQ(last.manifest().state["seq_len"].get<int64_t>(), 32);
  EXPECT_EQ(last.manifest().state["recipe"]["phase"].get<int>(), 2);
}

TEST_F(RecipeTest, ResumeInsideAndAcrossPhasesIsBitExact) {
  Trainer straight(config("straight"), {.quiet = true});
  TrainResult a = straight.run();
  ASSERT_EQ(a.losses.size(), static_cast<size_t>(kSteps));

  // Stops: step 5 (inside the ramp), step 10 (the last step of phase 0: the checkpoint holds phase
  // 0's loader while the next step belongs to phase 1), step 12 (inside phase 1), step 16 (inside
  // the long-context phase), then to the end.
  const int stops[] = {5, 10, 12, 16};
  std::vector<double> losses;
  int done = 0;
  for (int stop : stops) {
    Trainer part(config("split"),
                 {.resume = done ? "latest" : "", .quiet = true, .stop_after_steps = stop - done});
    TrainResult b = part.run();
    ASSERT_TRUE(b.interrupted);
    ASSERT_EQ(b.first_step, done);
    ASSERT_EQ(b.last_step, stop);
    losses.insert(losses.end(), b.losses.begin(), b.losses.end());
    done = stop;
  }
  Trainer resumed(config("split"), {.resume = "latest", .quiet = true});
  TrainResult c = resumed.run();
  ASSERT_EQ(c.first_step, done);
  losses.insert(losses.end(), c.losses.begin(), c.losses.end());
  ASSERT_EQ(losses.size(), a.losses.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(a.losses[i], losses[i]) << "step " << i + 1;
  EXPECT_EQ(flat(straight.model().params_flat()), flat(resumed.model().params_flat()));
  EXPECT_EQ(flat(straight.model().balancing_biases()), flat(resumed.model().balancing_biases()));
  auto sa = straight.optimizer().state_tensors(), sc = resumed.optimizer().state_tensors();
  ASSERT_EQ(sa.size(), sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].second.nbytes(), sc[i].second.nbytes());
    EXPECT_EQ(std::memcmp(sa[i].second.raw(), sc[i].second.raw(), sa[i].second.nbytes()), 0) << sa[i].first;
  }
  // Phase starts are logged once each, also across resumes (metrics.jsonl is appended to).
  int starts = 0;
  for (const nlohmann::json& m : metrics("split")) starts += m.value("event", "") == "phase_start";
  EXPECT_EQ(starts, 3);
}

TEST_F(RecipeTest, ResumeRefusesAMismatchedCheckpoint) {
  // A run without [recipe] cannot resume a recipe run's checkpoint (its loader state means
  // something else), and the other way round.
  {
    Trainer t(config("r"), {.quiet = true, .stop_after_steps = 2});
    t.run();
  }
  RunConfig plain = parse_run_config(toy::toy_config(web_, root_ / "r", 6), "toy.toml", {});
  EXPECT_THROW((Trainer(plain, {.resume = "latest", .quiet = true})), Error);
  {
    Trainer t(parse_run_config(toy::toy_config(web_, root_ / "p", 6), "toy.toml", {}),
              {.quiet = true, .stop_after_steps = 2});
    t.run();
  }
  EXPECT_THROW((Trainer(config("p"), {.resume = "latest", .quiet = true})), Error);
}

TEST(RecipeExample, ConfigParsesWithTheDocumentedShape) {
  // configs/recipe-example.toml: the step counts its header comment states (worked out there from
  // the ramp and the phase boundaries), θ inherited then raised for context extension.
  RunConfig c = load_run_config(std::string(ZAYA_SOURCE_DIR) + "/configs/recipe-example.toml", {});
  ASSERT_EQ(c.recipe.phases.size(), 3u);
  EXPECT_EQ(c.train.steps, 164);
  EXPECT_EQ(c.optim.total_steps, 164);
  EXPECT_EQ(c.recipe.phases[0].rope_theta, c.model.rope_theta);
  EXPECT_EQ(c.recipe.phases[2].rope_theta, 1e5);
  EXPECT_EQ(c.recipe.phases[2].seq_len, 1024);
  std::vector<int64_t> steps_per_batch(17, 0);
  int64_t consumed = 0;
  int first_of_phase1 = 0;
  for (int step = 1; consumed < c.recipe.total_tokens(); ++step) {
    optim::RecipeStep st = c.recipe.step_at(consumed, c.train.micro_batch);
    if (st.phase == 0) ++steps_per_batch[static_cast<size_t>(st.batch_size)];
    if (st.phase == 1 && !first_of_phase1) {
      first_of_phase1 = step;
      EXPECT_EQ(consumed, 328704);  // docs/train.md's example log line
    }
    consumed += st.tokens();
  }
  EXPECT_EQ(first_of_phase1, 105);
  EXPECT_EQ(steps_per_batch[4], 22);
  EXPECT_EQ(steps_per_batch[8], 11);
  EXPECT_EQ(steps_per_batch[12], 7);
  EXPECT_EQ(steps_per_batch[16], 64);
}

TEST(RecipeModel, RopeThetaSwitchMatchesAFreshModel) {
  // set_rope_theta must leave the model exactly as if it had been built with that θ: same loss
  // bit for bit (same parameters, same table), and a different loss from the old θ (the switch
  // takes effect).
  ConfigReader r = ConfigReader::from_string(toy::model_section(), "model.toml");
  model::ModelConfig c = model::ModelConfig::from_toml(r);
  model::ZayaModel switched(c, 2, 24);
  switched.init(5);
  model::ModelConfig c2 = c;
  c2.rope_theta = 1e5;
  model::ZayaModel fresh(c2, 2, 24);
  fresh.init(5);
  Tensor ids = Tensor::empty({2, 24}, DType::i32), targets = Tensor::empty({2, 24}, DType::i32);
  for (int64_t i = 0; i < 48; ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 64);
    targets.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 10) % 64);
  }
  const double before = switched.forward(ids, targets, false);
  switched.set_rope_theta(1e5);
  EXPECT_EQ(switched.config().rope_theta, 1e5);
  const double after = switched.forward(ids, targets, false);
  EXPECT_EQ(after, fresh.forward(ids, targets, false));
  EXPECT_NE(after, before);
  EXPECT_THROW(switched.set_rope_theta(0), Error);
}

TEST(RecipeData, OffsetsAndZeroWeightsInTheLoader) {
  const fs::path dir = fs::temp_directory_path() / ("zaya_recipe_loader_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string a = toy::make_corpus(dir, "a", 7, 4), b = toy::make_corpus(dir, "b", 11, 8);
  // Offsets: a loader started at dataset counts (c_a, c_b) gives the same samples as the plain
  // loader gives those datasets from their c_a-th / c_b-th sample on.
  data::DataLoader plain({{a, 1.0}, {b, 1.0}}, 16, 9);
  std::vector<std::vector<int32_t>> from_a, from_b;
  for (int64_t i = 0; i < 40; ++i) {
    data::SampleLocation loc = plain.locate(i);
    (loc.dataset == 0 ? from_a : from_b).push_back(plain.sample(i));
  }
  const std::vector<int64_t> at10 = plain.dataset_counts(10);
  EXPECT_EQ(at10, (std::vector<int64_t>{5, 5}));  // equal weights alternate
  data::DataLoader cont({{a, 1.0}, {b, 1.0}}, 16, 9);
  cont.set_dataset_offsets(at10);
  EXPECT_EQ(cont.dataset_counts(0), at10);
  for (int64_t i = 0; i < 20; ++i) {
    data::SampleLocation loc = cont.locate(i);
    const auto& expected = loc.dataset == 0 ? from_a : from_b;
    EXPECT_EQ(cont.sample(i), expected[static_cast<size_t>(loc.count)]) << i;
  }
  // A weight of 0 is never picked, even on the ties the greedy blend breaks toward lower indices.
  data::DataLoader only_b({{a, 0.0}, {b, 1.0}}, 16, 9);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(only_b.locate(i).dataset, 1) << i;
  EXPECT_EQ(only_b.dataset_counts(50), (std::vector<int64_t>{0, 50}));
  EXPECT_THROW(data::DataLoader({{a, 0.0}, {b, 0.0}}, 16, 9), Error);
  EXPECT_THROW(cont.set_dataset_offsets({1}), Error);
  fs::remove_all(dir);
}

// A recipe of absurdly many steps is an error, not a parse that never ends (the steps are counted
// one by one). Found by tests/fuzz/fuzz_run_config.
TEST(RecipeLimits, TooManyStepsAreAnErrorNotAHang) {
  const auto error_of = [](const std::string& recipe) -> std::string {
    try {
      parse_run_config(
          toy::model_section() + "[data]\ntrain = [\"unused\"]\n[train]\nmicro_batch = 1\n" + recipe,
          "many.toml", {});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // 10^15 one-token steps: rejected before counting.
  std::string e = error_of("[[recipe.phases]]\ntokens = 1000000000000000\nseq_len = 1\nbatch_size = 1\n");
  EXPECT_NE(e.find("recipe.phases"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 10000000 optimizer steps"), std::string::npos) << e;
  EXPECT_NE(e.find("at least 1000000000000000"), std::string::npos) << e;
  // 10^7 steps at the full batch of 2^20 sequences, but the ramp from 1 sequence over the whole
  // phase takes about ln(2^20) = 14 times as many: found while counting, at the limit.
  e = error_of(
      "[recipe]\nbatch_ramp_start = 1\nbatch_ramp_tokens = 10485760000000\n"
      "[[recipe.phases]]\ntokens = 10485760000000\nseq_len = 1\nbatch_size = 1048576\n");
  EXPECT_NE(e.find("at most 10000000 optimizer steps"), std::string::npos) << e;
  EXPECT_NE(e.find("batch ramp"), std::string::npos) << e;
}

}  // namespace
}  // namespace zaya::train
