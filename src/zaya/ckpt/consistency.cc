#include "zaya/ckpt/consistency.h"

#include <map>

#include "zaya/ckpt/fs_util.h"
#include "zaya/core/error.h"
#include "zaya/model/config.h"
#include "zaya/model/params.h"

namespace zaya::ckpt {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The layer index of a "model.layers.<n>." name (also an optimizer state tensor of that layer's
// parameter, "model.layers.<n>.<...>.adam_m"); -1 for other names.
int64_t layer_of(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  size_t i = kPrefix.size(), end = i;
  while (end < name.size() && end - i < 9 && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == i || end >= name.size() || name[end] != '.') return -1;
  return std::stoll(name.substr(i, end - i));
}

// At most this many tensors are named per kind of disagreement; the count says how many in all.
constexpr size_t kNamed = 3;

std::string named_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kNamed; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kNamed) out += str(", ... (", names.size(), " in all)");
  return out;
}

}  // namespace

std::vector<std::string> step_problems(const Manifest& m, const std::filesystem::path& dir) {
  std::vector<std::string> out;
  const std::string mpath = (dir / "manifest.json").string();
  const std::string name = dir.filename().string();
  if (const auto named = parse_step_dir_name(name); named && *named != m.step)
    out.push_back(str(mpath, ": the manifest says step ", m.step, " but its directory is ", name, " (step ",
                      *named, "); a renamed or copied checkpoint, or an edited manifest"));
  if (m.state.contains("step") && m.state["step"].is_number_integer() &&
      m.state["step"].get<int64_t>() != m.step)
    out.push_back(str(mpath, ": the manifest says step ", m.step, " but its state says step ",
                      m.state["step"].get<int64_t>()));
  return out;
}

std::vector<std::string> model_config_problems(const Manifest& m, const std::filesystem::path& dir) {
  const std::string mpath = (dir / "manifest.json").string();
  if (!m.state.contains("model_config")) return {};
  model::ModelConfig c;
  try {
    c = model::ModelConfig::from_hf_json_text(m.state["model_config"].dump(),
                                              mpath + " (state.model_config)");
  } catch (const Error& e) {
    return {str("the state's model_config is not a valid model config: ", e.what())};
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& [name, shape] : model::weight_shapes(c))
    expected.push_back({name, std::vector<int64_t>(shape.begin(), shape.end())});

  std::vector<std::string> out, missing, extra_layer;
  for (const auto& [name, shape] : expected) {
    auto it = m.tensors.find(name);
    if (it == m.tensors.end()) {
      missing.push_back(name);
    } else if (it->second.shape != shape) {
      out.push_back(str(mpath, ": tensor '", name, "' has shape ", shape_str(it->second.shape),
                        " but the state's model_config (vocab_size = ", c.vocab_size,
                        ", hidden_size = ", c.hidden_size, ", num_experts = ", c.num_experts,
                        ", ...) implies ", shape_str(shape)));
    }
  }
  for (const auto& [name, t] : m.tensors) {
    const int64_t l = layer_of(name);
    if (l >= c.num_hidden_layers) extra_layer.push_back(name);
  }
  if (!missing.empty())
    out.push_back(str(mpath, ": the state's model_config (num_hidden_layers = ", c.num_hidden_layers,
                      ") implies tensors that the checkpoint lacks: ", named_list(missing)));
  if (!extra_layer.empty())
    out.push_back(str(mpath, ": the state's model_config says num_hidden_layers = ", c.num_hidden_layers,
                      " but the checkpoint holds tensors of later layers: ", named_list(extra_layer)));
  return out;
}

}  // namespace zaya::ckpt
