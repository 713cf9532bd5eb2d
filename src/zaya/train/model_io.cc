#include "zaya/train/model_io.h"

#include "zaya/ckpt/finite.h"
#include "zaya/ckpt/hf_io.h"
#include "zaya/core/build_info.h"
#include "zaya/core/error.h"
#include "zaya/model/params.h"

namespace zaya::train {
namespace fs = std::filesystem;

std::vector<ckpt::SaveItem> weight_items(const model::ZayaModel& m) {
  ZAYA_CHECK(m.weight_dtype() == DType::f32,
             "weight_items: the model's weights are stored in bf16; a checkpoint stores the fp32 master weights");
  std::vector<ckpt::SaveItem> items;
  for (auto& [name, t] : m.weights()) items.push_back({name, t, {}, {}});
  return items;
}

std::vector<ckpt::SaveItem> weight_items(const model::ZayaModel& m, optim::ShardRange range, bool with_replicated,
                                         const Tensor& values) {
  const int64_t P = m.params_flat().numel();
  if (range.end < 0) range.end = P;
  ZAYA_CHECK(values.defined() || m.weight_dtype() == DType::f32,
             "weight_items: the model's weights are stored in bf16; a checkpoint stores the fp32 master weights, "
             "pass them as the values");
  if (values.defined())
    ZAYA_CHECK(values.dtype() == DType::f32 && values.numel() == range.end - range.begin, "weight_items: values ",
               values.str(), " for the range [", range.begin, ", ", range.end, ")");
  else if (range.begin == 0 && range.end == P && with_replicated)
    return weight_items(m);
  const Tensor& source = values.defined() ? values : m.params_flat();
  const int64_t shift = values.defined() ? range.begin : 0;
  std::vector<ckpt::SaveItem> items;
  const std::vector<std::pair<std::string, Tensor>> weights = m.weights();
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const model::ParamSpec& spec = m.specs()[i];
    const int64_t off = m.param_offset(static_cast<int>(i)), n = spec.shape.numel();
    const int64_t lo = std::max(off, range.begin) - off, hi = std::min(off + n, range.end) - off;
    if (hi <= lo) continue;
    optim::RowBox box = optim::row_box(spec.shape, lo, hi, spec.name);
    items.push_back({spec.name, source.window(off + lo - shift, Shape::of(box.shape)), std::move(box.global),
                     std::move(box.offsets)});
  }
  if (with_replicated)
    for (size_t i = m.specs().size(); i < weights.size(); ++i) items.push_back({weights[i].first, weights[i].second, {}, {}});
  return items;
}

void load_weights(const ckpt::Checkpoint& c, model::ZayaModel& m) {
  // The checksums say the bytes are the ones written; the finiteness check says they are usable
  // (a checkpoint written from non-finite weights verifies but cannot train or evaluate).
  const std::string where = (c.dir() / "manifest.json").string();
  ZAYA_CHECK(m.weight_dtype() == DType::f32, where,
             ": the model's weights are stored in bf16; checkpoints load into f32 weights (before "
             "ZayaModel::store_weights_bf16)");
  for (const auto& [name, t] : m.weights()) {
    c.load(name, t);
    ckpt::require_finite(t, name, where);
  }
}

model::ModelConfig checkpoint_model_config(const ckpt::Checkpoint& c) {
  const nlohmann::json& s = c.manifest().state;
  if (!s.contains("model_config"))
    throw Error("checkpoint state has no model_config (not written by zaya train or zaya ckpt import-hf)",
                {.file = (c.dir() / "manifest.json").string()});
  return model::ModelConfig::from_hf_json_text(s["model_config"].dump(), (c.dir() / "manifest.json").string());
}

namespace {
bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "config.json", ec) && !fs::exists(fs::path(path) / "manifest.json", ec);
}

// A directory that is neither kind gets one message naming both, instead of the checkpoint
// reader's (which knows only its own kind) or the transformers loader's.
void require_model_source(const std::string& path) {
  std::error_code ec;
  ZAYA_CHECK(fs::is_directory(path, ec), path,
             ": no such directory (expected a zaya checkpoint or a transformers model directory)");
  const fs::path p(path);
  ZAYA_CHECK(
      is_hf_dir(path) || fs::exists(p / "manifest.json", ec) || fs::exists(p / "latest", ec), path,
      ": neither a zaya checkpoint (a step directory with manifest.json, or a run directory whose `latest` "
      "names one) nor a transformers model directory (config.json with model.safetensors or its index)");
}
}  // namespace

nlohmann::json source_state(const std::string& path) {
  require_model_source(path);
  if (is_hf_dir(path)) return nlohmann::json::object();
  return ckpt::Checkpoint(path).manifest().state;
}

std::unique_ptr<model::ZayaModel> model_on(std::unique_ptr<model::ZayaModel> m, Device device, int64_t batch,
                                           int64_t seq_len) {
  if (m->device() == device && m->batch() == batch && m->seq_len() == seq_len) return m;
  auto out = std::make_unique<model::ZayaModel>(m->config(), batch, seq_len, device);
  Tensor params = out->params_flat(), beta = out->balancing_biases();  // handles to the live buffers
  params.copy_from(m->params_flat());
  beta.copy_from(m->balancing_biases());
  return out;
}

LoadedModel load_model_source(const std::string& path, int64_t batch, int64_t seq_len, Device device) {
  require_model_source(path);
  LoadedModel out;
  // Off the CPU the weights are read into a host model with the smallest activations, then copied.
  const bool host = device == Device::cpu;
  const int64_t b = host ? batch : 1, t = host ? seq_len : 1;
  if (is_hf_dir(path)) {
    out.model = model_on(ckpt::load_hf_model(path, b, t), device, batch, seq_len);
    out.source = path;
    out.from_hf = true;
    return out;
  }
  ckpt::Checkpoint c(path);
  out.model = std::make_unique<model::ZayaModel>(checkpoint_model_config(c), b, t);
  load_weights(c, *out.model);
  out.model = model_on(std::move(out.model), device, batch, seq_len);
  out.state = c.manifest().state;
  out.source = c.dir();
  return out;
}

fs::path save_weights_checkpoint(const model::ZayaModel& m, const fs::path& run_dir, const nlohmann::json& extra) {
  nlohmann::json state = extra.is_object() ? extra : nlohmann::json::object();
  state["format"] = "zaya-weights-1";
  state["written_by"] = {{"program", "zaya"}, {"version", version()}, {"commit", build_commit()}};
  state["step"] = 0;
  state["model_config"] = nlohmann::json::parse(m.config().to_hf_json());
  return ckpt::save_checkpoint(run_dir, 0, {weight_items(m)}, state);
}

}  // namespace zaya::train
