// SentencePiece, wrapped: train a BPE model with byte fallback, or load an existing .model (e.g.
// Gemma 3's); encode, decode and the special ids. Models we train use pad 0, eos 1, bos 2, unk 3
// (pad 0 matches the model's pad_token_id 0; docs/data.md). Loaded models keep their own ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace zaya::data {

struct TokenizerTrainOptions {
  int vocab_size = 8192;
  // SentencePiece samples at most this many training lines (shuffled); the rest are skipped.
  // Bounds training time on large corpora (docs/data.md has measured times).
  int64_t input_sentence_size = 1000000;
  int num_threads = 2;
  uint64_t seed = 1234;
  bool quiet = true;  // silence SentencePiece's own progress logging
  // With quiet: progress on stderr (core/task_progress.h) in pieces of the vocabulary added so
  // far, read from SentencePiece's log lines; only its errors still pass through.
  bool progress = false;
};

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Trains BPE with byte fallback on `lines` (SentencePiece's training unit is one line) and
  // returns the tokenizer; `serialized_model` receives the .model bytes. Identity normalization,
  // no dummy prefix and kept whitespace make decode(encode(text)) == text for every UTF-8 text.
  // Throws zaya::Error when the corpus cannot support `vocab_size`.
  static Tokenizer train(const std::vector<std::string>& lines, const TokenizerTrainOptions& options,
                         std::string* serialized_model = nullptr);
  static Tokenizer load(const std::string& model_file);
  static Tokenizer from_serialized(const std::string& serialized_model, const std::string& name = "<memory>");

  int vocab_size() const;
  int pad_id() const;  // -1 when the model has none
  int eos_id() const;
  int bos_id() const;
  int unk_id() const;

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int id) const;
  // Whether encoding prepends "▁" to the text (SentencePiece's add_dummy_prefix, as Llama's
  // tokenizer does; the ones zaya trains do not). Read from behaviour, so it holds for any .model.
  bool adds_dummy_prefix() const;
  // Writes the ".vocab" text file SentencePiece's trainer writes: "piece\tscore" per line.
  void write_vocab(const std::string& path) const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string name_;
};

}  // namespace zaya::data
