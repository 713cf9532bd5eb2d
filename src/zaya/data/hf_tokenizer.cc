#include "zaya/data/hf_tokenizer.h"

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "zaya/core/error.h"
#include "zaya/data/tokenizer.h"

namespace zaya::data {
namespace fs = std::filesystem;

namespace {

void write_json(const fs::path& path, const nlohmann::ordered_json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << "\n";
  out.flush();
  ZAYA_CHECK(out.good(), "cannot write ", path.string());
}

}  // namespace

void write_hf_tokenizer(const fs::path& model_file, const SpecialIds& model_ids, const fs::path& dir) {
  const Tokenizer tok = Tokenizer::load(model_file.string());
  const struct {
    const char* name;
    int tokenizer_id;
    int64_t model_id;
  } specials[] = {{"bos", tok.bos_id(), model_ids.bos}, {"eos", tok.eos_id(), model_ids.eos},
                  {"pad", tok.pad_id(), model_ids.pad}};
  for (const auto& s : specials)
    ZAYA_CHECK(s.tokenizer_id < 0 || s.model_id < 0 || s.tokenizer_id == s.model_id, model_file.string(),
               ": the tokenizer's ", s.name, " id is ", s.tokenizer_id, " but the model's ", s.name,
               "_token_id is ", s.model_id, "; export with the tokenizer the model was trained with");
  fs::create_directories(dir);
  fs::copy_file(model_file, dir / "tokenizer.model", fs::copy_options::overwrite_existing);

  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  auto special = [&](const char* key, int id) {
    if (id >= 0) map[key] = tok.piece(id);
  };
  special("bos_token", tok.bos_id());
  special("eos_token", tok.eos_id());
  special("unk_token", tok.unk_id());
  special("pad_token", tok.pad_id());
  write_json(dir / "special_tokens_map.json", map);

  nlohmann::ordered_json config;
  config["tokenizer_class"] = tok.adds_dummy_prefix() ? "LlamaTokenizer" : "GemmaTokenizer";
  for (const auto& [k, v] : map.items()) config[k] = v;
  // GemmaTokenizer otherwise adds a <mask> token the model has no embedding row for.
  config["mask_token"] = nullptr;
  config["add_bos_token"] = false;
  config["add_eos_token"] = false;
  config["legacy"] = false;
  config["spaces_between_special_tokens"] = false;
  config["clean_up_tokenization_spaces"] = false;  // decode(encode(text)) == text, spaces included
  write_json(dir / "tokenizer_config.json", config);
}

}  // namespace zaya::data
