#include "model_source.h"

#include "zaya/core/cuda_runtime.h"

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "zaya/core/config.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/error.h"
#include "zaya/train/model_io.h"

namespace zaya::app {

std::unique_ptr<model::ZayaModel> make_model(const ModelSource& s, int64_t batch, int64_t seq,
                                             const std::string& command, optim::OptimizerConfig* optim) {
  ZAYA_CHECK(s.model.empty() != s.init_config.empty(), command,
             ": give exactly one of --model and --init-config");
  ZAYA_CHECK(s.overrides.empty() || !s.init_config.empty(), command,
             ": --set overrides keys of --init-config; it cannot change a --model");
  const Device device = parse_device_flag(s.device);
  if (!s.model.empty()) {
    if (optim) *optim = optim::OptimizerConfig{};
    return load_model_checked(s.model, batch, seq, command, device).model;
  }
  ConfigReader reader = ConfigReader::from_file(s.init_config, s.overrides);
  const model::ModelConfig config = model::ModelConfig::from_toml(reader);
  if (optim) *optim = optim::OptimizerConfig::from_toml(reader);
  // The config's other sections (train, data, ...) are other commands' business, so finish() does
  // not apply; but a --set key must be one this command read.
  for (const std::string& o : s.overrides) {
    const std::string key = o.substr(0, o.find('='));
    ZAYA_CHECK(reader.values().count(key) > 0, command, ": --set ", o, ": '", key, "' is not a key ", command,
               " reads (the [model] section", optim ? " and [optim]" : "", ")");
  }
  check_positions(config, seq, command);
  auto m = std::make_unique<model::ZayaModel>(config, batch, seq, device);
  m->init(s.seed);
  return m;
}

Device parse_device_flag(const std::string& device) {
  ZAYA_CHECK(device == "cpu" || device == "cuda", "--device: expected cpu or cuda, found '", device, "'");
  if (device == "cpu") return Device::cpu;
  ZAYA_CHECK(cuda::device_count() > 0, "--device cuda: this process sees no GPU (", cuda::no_device_reason(), ")");
  return Device::cuda;
}

train::LoadedModel load_model_checked(const std::string& path, int64_t batch, int64_t seq, const std::string& what,
                                      Device device) {
  train::LoadedModel m = train::load_model_source(path, 1, 1, device);  // the weights, the smallest activations
  check_positions(m.model->config(), seq, what);
  m.model->set_batch_shape(batch, seq);
  return m;
}

namespace {

// The directory training ran in: `run_dir` less the trailing components of a relative out_dir
// (`runs/demo` from /home/u/zaya/runs/demo gives /home/u/zaya). Empty when they do not match.
std::filesystem::path training_directory(const std::filesystem::path& run_dir, const nlohmann::json& state) {
  const std::string toml = state.value("config_toml", std::string());
  if (toml.empty()) return {};
  std::vector<std::string> overrides;
  for (const auto& o : state.value("config_overrides", nlohmann::json::array()))
    if (o.is_string()) overrides.push_back(o.get<std::string>());
  std::string out_dir;
  try {
    ConfigReader::from_string(toml, "the checkpoint's config", overrides).get("train.out_dir", out_dir);
  } catch (const Error&) {
    return {};  // a config this build no longer reads: the other places are still tried
  }
  std::filesystem::path out = std::filesystem::path(out_dir).lexically_normal(), dir = run_dir.lexically_normal();
  if (out.empty() || out.is_absolute()) return {};
  std::vector<std::filesystem::path> parts(out.begin(), out.end());
  if (!parts.empty() && parts.back().empty()) parts.pop_back();  // a trailing '/'
  if (!dir.empty() && dir.filename().empty()) dir = dir.parent_path();
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (dir.filename() != *it) return {};
    dir = dir.parent_path();
  }
  return dir.empty() ? std::filesystem::path(".") : dir;
}

}  // namespace

std::string source_tokenizer(const std::string& source) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(source) / "config.json", ec)) {  // a transformers directory
    const fs::path model = fs::path(source) / "tokenizer.model";
    return fs::is_regular_file(model, ec) ? model.string() : std::string();
  }
  const nlohmann::json state = train::source_state(source);
  const std::string recorded = state.value("tokenizer", std::string());
  const fs::path run_dir = fs::absolute(ckpt::Checkpoint::resolve(source)).parent_path();
  // The run directory's copy (train/run_tokenizer.h) first: it is the very file the run trained
  // with, wherever the original has gone since.
  if (const std::string copy = state.value("tokenizer_copy", std::string()); !copy.empty()) {
    if (fs::is_regular_file(run_dir / copy, ec)) return (run_dir / copy).string();
  }
  if (recorded.empty()) return {};
  const fs::path p(recorded);
  std::vector<fs::path> tried{p};
  if (p.is_relative()) {
    tried.push_back(run_dir / p);
    if (fs::path root = training_directory(run_dir, state); !root.empty()) tried.push_back(root / p);
  }
  std::string places;
  for (const fs::path& t : tried) {
    if (fs::is_regular_file(t, ec)) return t.string();
    places += "\n  " + t.string();
  }
  throw Error(str(source, ": the checkpoint's tokenizer '", recorded, "' was not found; tried:", places,
                  "\npass the SentencePiece .model it was trained with as --tokenizer"));
}

void check_positions(const model::ModelConfig& c, int64_t positions, const std::string& what) {
  ZAYA_CHECK(positions <= c.max_position_embeddings, what, ": ", positions,
             " positions exceed the model's max_position_embeddings (", c.max_position_embeddings,
             "), the longest sequence it is made for");
}

void apply_gemm_dtype(const ModelSource& s, model::ZayaModel& m) {
  ZAYA_CHECK(s.gemm_dtype == "f32" || s.gemm_dtype == "bf16", "--gemm-dtype: expected f32 or bf16, found '",
             s.gemm_dtype, "'");
  if (s.gemm_dtype == "bf16") m.set_gemm_dtype(DType::bf16);
}

}  // namespace zaya::app
