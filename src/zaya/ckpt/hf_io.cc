#include "zaya/ckpt/hf_io.h"

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "zaya/ckpt/finite.h"
#include "zaya/ckpt/hf_legacy.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/log.h"
#include "zaya/model/params.h"

namespace zaya::ckpt {

namespace fs = std::filesystem;

model::ModelConfig read_hf_config(const fs::path& dir) {
  fs::path p = dir / "config.json";
  ZAYA_CHECK(fs::exists(p), "not a transformers model directory: ", dir.string(), " has no config.json");
  return model::ModelConfig::from_hf_json(p.string());
}

void copy_hf_tensor(const SafetensorsFile& f, const StTensorInfo& info, const Tensor& dst) {
  std::vector<int64_t> want(dst.shape().begin(), dst.shape().end());
  if (info.shape != want) {
    std::ostringstream found;
    found << "[";
    for (size_t i = 0; i < info.shape.size(); ++i) found << (i ? ", " : "") << info.shape[i];
    found << "]";
    throw Error(str("tensor '", info.name, "' has shape ", found.str(), ", expected ", dst.shape().str()),
                {.file = f.path().string(), .field = info.name, .expected = dst.shape().str(), .found = found.str()});
  }
  auto raw = f.raw(info.name);
  float* out = dst.data<float>();
  const int64_t n = dst.numel();
  if (info.dtype == "F32") {
    std::memcpy(out, raw.data(), static_cast<size_t>(n) * 4);
  } else if (info.dtype == "BF16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      out[i] = to_float(bf16{b});
    }
  } else {
    throw Error(str("tensor '", info.name, "' has dtype ", info.dtype, ", expected F32 or BF16"),
                {.file = f.path().string(), .field = info.name, .expected = "F32 or BF16", .found = info.dtype});
  }
  require_finite(dst, info.name, f.path().string());
}

std::vector<fs::path> hf_weight_files(const fs::path& dir) {
  fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) return {single};
  ZAYA_CHECK(fs::exists(index), "no model.safetensors or model.safetensors.index.json in ", dir.string());
  std::ifstream in(index);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw Error(str("malformed JSON: ", e.what()), {.file = index.string()});
  }
  ZAYA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
             ": expected an object with a \"weight_map\" object");
  std::set<std::string> files;
  for (auto& [name, file] : j["weight_map"].items()) {
    ZAYA_CHECK(file.is_string(), index.string(), ": weight_map[\"", name, "\"] must be a file name");
    std::string fn = file.get<std::string>();
    ZAYA_CHECK(fn.find('/') == std::string::npos && fn.find("..") == std::string::npos, index.string(),
               ": weight_map[\"", name, "\"] names a file outside the directory: ", fn);
    files.insert(fn);
  }
  std::vector<fs::path> out;
  for (const std::string& f : files) out.push_back(dir / f);
  return out;
}

void load_hf_weights(const fs::path& dir, model::ZayaModel& m) {
  const model::ModelConfig& c = m.config();
  if (is_legacy_hf_dir(dir)) return load_legacy_hf_weights(dir, hf_weight_files(dir), m);
  std::set<std::string> loaded;
  std::vector<std::pair<std::string, Tensor>> lm_heads;
  for (const fs::path& file : hf_weight_files(dir)) {
    SafetensorsFile f(file);
    for (const StTensorInfo& info : f.header().tensors) {
      ZAYA_CHECK(!loaded.count(info.name), "tensor '", info.name, "' appears twice (again in ", file.string(), ")");
      int idx = m.param_index(info.name);
      if (idx >= 0) {
        copy_hf_tensor(f, info, m.param(idx));
      } else if (info.name == "lm_head.weight") {
        Tensor t = Tensor::empty(Shape{c.vocab_size, c.hidden_size}, DType::f32);
        copy_hf_tensor(f, info, t);
        lm_heads.push_back({file.string(), t});
      } else {
        int layer = -1;
        for (int l = 0; l < c.num_hidden_layers; ++l)
          if (info.name == model::balancing_bias_name(l)) layer = l;
        if (layer < 0)
          throw Error(str("unexpected tensor '", info.name, "' (not a ZAYA1 parameter for this config)"),
                      {.file = file.string(), .field = info.name, .expected = "a name from parameter_specs()"});
        copy_hf_tensor(f, info, m.balancing_biases().select(layer));
      }
      loaded.insert(info.name);
    }
  }
  for (const model::ParamSpec& s : m.specs())
    ZAYA_CHECK(loaded.count(s.name), "missing tensor '", s.name, "' ", s.shape.str(), " in ", dir.string());
  for (int l = 0; l < c.num_hidden_layers; ++l)
    ZAYA_CHECK(loaded.count(model::balancing_bias_name(l)), "missing tensor '", model::balancing_bias_name(l),
               "' in ", dir.string());
  for (auto& [file, t] : lm_heads)
    ZAYA_CHECK(std::memcmp(t.raw(), m.param(0).raw(), t.nbytes()) == 0, file,
               ": lm_head.weight differs from model.embed_tokens.weight, but ZAYA1 ties them");
}

std::unique_ptr<model::ZayaModel> load_hf_model(const fs::path& dir, int64_t batch, int64_t seq_len) {
  auto m = std::make_unique<model::ZayaModel>(read_hf_config(dir), batch, seq_len);
  load_hf_weights(dir, *m);
  return m;
}

void export_hf(const model::ZayaModel& m, const fs::path& dir, DType dtype, uint64_t shard_bytes) {
  ZAYA_CHECK(dtype == DType::f32 || dtype == DType::bf16, "export_hf: dtype must be f32 or bf16, found ",
             dtype_name(dtype));
  if (m.config().skip_passthrough) {
    // transformers' native ZayaForCausalLM has no skip passthrough: it gives a token routed to the
    // skip class MoE output 0. The export still writes the weights exactly (a user converting
    // ZAYA1-base wants the native checkpoint), and says loudly where the two functions differ.
    // config.json keeps `skip_passthrough: true`, which transformers ignores and zaya reads back.
    const std::vector<int64_t> can_skip = skip_class_winning_layers(m);
    if (can_skip.empty())
      log_info("export-hf: the model has skip_passthrough on (the legacy ZAYA1 MoE), but in no layer can the skip "
               "class win (balancing biases), so transformers' native ZayaForCausalLM computes the same outputs");
    else
      log_warn("export-hf: OUTPUTS WILL DIFFER in transformers. This model has skip_passthrough on (the legacy "
               "ZAYA1 MoE, as imported from ZAYA1-base): a token whose router picks the skip class gets p_skip times "
               "its normalized input from the MoE block, where transformers' native ZayaForCausalLM gives it 0. "
               "In layer(s) ", layer_list(can_skip), " the balancing biases let the skip class win, so the exported "
               "model's logits differ from zaya's for any token routed there (docs/legacy-import.md, \"The skip "
               "class\")");
  }
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << m.config().to_hf_json() << "\n";
    ZAYA_CHECK(out.good(), "cannot write ", (dir / "config.json").string());
  }
  {
    // generate() and pipeline() take their stop and pad ids from here, not from config.json.
    const model::ModelConfig& c = m.config();
    nlohmann::ordered_json g;
    g["bos_token_id"] = c.bos_token_id;
    g["eos_token_id"] = c.eos_token_id;
    g["pad_token_id"] = c.pad_token_id;
    std::ofstream out(dir / "generation_config.json");
    out << g.dump(2) << "\n";
    ZAYA_CHECK(out.good(), "cannot write ", (dir / "generation_config.json").string());
  }
  // (name, f32 source); balancing biases are always stored in f32 (they are fp32 buffers in HF).
  struct Item {
    std::string name;
    Tensor t;
    bool keep_f32;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < m.specs().size(); ++i) items.push_back({m.specs()[i].name, m.param(static_cast<int>(i)), false});
  for (int l = 0; l < m.config().num_hidden_layers; ++l)
    items.push_back({model::balancing_bias_name(l), m.balancing_biases().select(l), true});

  std::vector<std::vector<StEntry>> shards(1);
  std::vector<Tensor> converted;  // bf16 copies kept alive until written
  uint64_t in_shard = 0, total = 0;
  for (const Item& it : items) {
    Tensor src = it.t;
    if (src.device() != Device::cpu) {  // written from the host: a model on a GPU is copied over
      src = src.to(Device::cpu);
      converted.push_back(src);
    }
    if (dtype == DType::bf16 && !it.keep_f32) {
      Tensor b = Tensor::empty(src.shape(), DType::bf16);
      const float* s = src.data<float>();
      zaya::bf16* d = b.data<zaya::bf16>();
      for (int64_t i = 0; i < src.numel(); ++i) d[i] = to_bf16(s[i]);
      converted.push_back(b);
      src = b;
    }
    if (in_shard > 0 && in_shard + src.nbytes() > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(st_entry(it.name, src));
    in_shard += src.nbytes();
    total += src.nbytes();
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors(dir / "model.safetensors", shards[0], meta);
    return;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    write_safetensors(dir / name, shards[k], meta);
    for (const StEntry& e : shards[k]) map[e.name] = name;
  }
  index["weight_map"] = map;
  std::ofstream out(dir / "model.safetensors.index.json");
  out << index.dump(2) << "\n";
  ZAYA_CHECK(out.good(), "cannot write ", (dir / "model.safetensors.index.json").string());
}

}  // namespace zaya::ckpt
