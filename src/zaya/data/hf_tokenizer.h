// A SentencePiece tokenizer written as transformers loads it: the .model itself plus the
// tokenizer_config.json and special_tokens_map.json that make AutoTokenizer build the same
// tokenizer (SentencePiece BPE with byte fallback) with the same special ids.
#pragma once

#include <cstdint>
#include <filesystem>

namespace zaya::data {

// The special ids a model was configured with (config.json's bos/eos/pad_token_id).
struct SpecialIds {
  int64_t bos = -1, eos = -1, pad = -1;
};

// Copies `model_file` to dir/tokenizer.model and writes tokenizer_config.json and
// special_tokens_map.json. The class is GemmaTokenizer (no "▁" prepended, as zaya trains its
// tokenizers) or, for a tokenizer that prepends one, LlamaTokenizer: the one whose conversion
// reproduces SentencePiece's ids. No BOS/EOS is added on encode, as zaya's generate encodes.
// Throws when the tokenizer's special ids differ from the model's: an export whose tokenizer ends
// text with one id while the model stops on another would generate past the end.
void write_hf_tokenizer(const std::filesystem::path& model_file, const SpecialIds& model_ids,
                        const std::filesystem::path& dir);

}  // namespace zaya::data
