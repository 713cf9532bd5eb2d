// `ckpt verify` checks what a checkpoint says about itself against what it holds (issue 35): the
// model config in its state against its tensors, and its step against its directory's name.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/ckpt_test_util.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/writer.h"
#include "zaya/model/config.h"
#include "zaya/model/params.h"

namespace zaya::ckpt {
namespace {
namespace fs = std::filesystem;
using test::patterned;
using test::TempDir;

// A 2-layer model's config in the transformers schema (the state's "model_config").
model::ModelConfig two_layers() {
  model::ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.num_experts = 3;
  c.moe_intermediate_size = 32;
  c.router_hidden_size = 32;
  c.max_position_embeddings = 64;
  return c;
}

// Saves a checkpoint of `c`'s parameters and balancing biases (patterned values) plus one
// optimizer-state-like tensor per parameter, as `zaya train` would; returns its directory.
fs::path save_model_checkpoint(const fs::path& run, int64_t step, const model::ModelConfig& c) {
  std::vector<SaveItem> items;
  uint32_t seed = 1;
  for (const model::ParamSpec& s : model::parameter_specs(c)) {
    items.push_back({s.name, patterned(s.shape, DType::f32, seed++), {}, {}});
    items.push_back({s.name + ".adam_m", patterned(s.shape, DType::f32, seed++), {}, {}});
  }
  for (int l = 0; l < c.num_hidden_layers; ++l)
    items.push_back(
        {model::balancing_bias_name(l), patterned(Shape{c.num_experts + 1}, DType::f32, seed++), {}, {}});
  nlohmann::json state = {{"format", "zaya-train-1"}, {"step", step}};
  state["model_config"] = nlohmann::json::parse(c.to_hf_json());
  return save_checkpoint(run, step, {items}, state);
}

// Rewrites a checkpoint's manifest through `edit` (still a manifest that parses).
template <class Edit>
void edit_manifest(const fs::path& dir, Edit edit) {
  Manifest m = parse_manifest(read_small_file(dir / "manifest.json", 1 << 24), "manifest");
  edit(m);
  write_file_atomic(dir / "manifest.json", manifest_to_string(m));
}

std::string joined(const VerifyReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += p + "\n";
  return s;
}

TEST(VerifyModel, ConsistentCheckpointVerifies) {
  TempDir dir;
  const fs::path d = save_model_checkpoint(dir.path(), 7, two_layers());
  const VerifyReport r = Checkpoint(d).verify();
  EXPECT_TRUE(r.ok()) << joined(r);
}

// The probe: num_hidden_layers edited to 1 in the manifest's model config. Every checksum
// still matches; the tensors of layer 1 are what disagrees, and the problem names both.
TEST(VerifyModel, ModelConfigThatDisagreesWithTheTensorsFails) {
  TempDir dir;
  const fs::path d = save_model_checkpoint(dir.path(), 7, two_layers());
  edit_manifest(d, [](Manifest& m) { m.state["model_config"]["num_hidden_layers"] = 1; });
  const VerifyReport r = Checkpoint(d).verify();
  ASSERT_FALSE(r.ok());
  const std::string all = joined(r);
  EXPECT_NE(all.find("num_hidden_layers = 1"), std::string::npos) << all;
  EXPECT_NE(all.find("model.layers.1."), std::string::npos) << all;

  // A tensor of the wrong shape for the config (hidden_size edited) is named with both shapes.
  TempDir dir2;
  const fs::path d2 = save_model_checkpoint(dir2.path(), 7, two_layers());
  edit_manifest(d2, [](Manifest& m) { m.state["model_config"]["vocab_size"] = 96; });
  const std::string shape = joined(Checkpoint(d2).verify());
  EXPECT_NE(shape.find("model.embed_tokens.weight"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[96, 32]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[64, 32]"), std::string::npos) << shape;

  // A missing parameter (the config expects it, the checkpoint lacks it).
  TempDir dir3;
  const fs::path d3 = save_model_checkpoint(dir3.path(), 7, two_layers());
  edit_manifest(d3, [](Manifest& m) { m.state["model_config"]["num_hidden_layers"] = 3; });
  const std::string missing = joined(Checkpoint(d3).verify());
  EXPECT_NE(missing.find("model.layers.2."), std::string::npos) << missing;
  EXPECT_NE(missing.find("lacks"), std::string::npos) << missing;
}

// A step directory renamed (or a manifest's step edited) no longer says which step it holds.
TEST(VerifyModel, StepThatDisagreesWithTheDirectoryNameFails) {
  TempDir dir;
  const fs::path d = save_model_checkpoint(dir.path(), 7, two_layers());
  const fs::path renamed = dir.path() / "step_0000009";
  fs::rename(d, renamed);
  VerifyReport r = Checkpoint(renamed).verify();
  ASSERT_FALSE(r.ok());
  std::string all = joined(r);
  EXPECT_NE(all.find("step 7"), std::string::npos) << all;
  EXPECT_NE(all.find("step_0000009"), std::string::npos) << all;

  fs::rename(renamed, d);
  edit_manifest(d, [](Manifest& m) { m.step = 8; });
  all = joined(Checkpoint(d).verify());
  EXPECT_NE(all.find("step 8"), std::string::npos) << all;
  EXPECT_NE(all.find("step_0000007"), std::string::npos) << all;
  EXPECT_NE(all.find("state"), std::string::npos) << all;  // state.step (7) disagrees too
}

}  // namespace
}  // namespace zaya::ckpt
