#include "zaya/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <streambuf>
#include <unordered_map>

#include "zaya/core/error.h"
#include "zaya/core/task_progress.h"

// Not in SentencePiece's public headers but exported by libsentencepiece: the switch for its
// progress logging (what spm_train's --minloglevel sets).
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
int GetMinLogLevel();
}  // namespace sentencepiece::logging

namespace zaya::data {
namespace {

// Hands the training lines to SentencePiece from memory (no temporary text file).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t i_ = 0;
};

// While SentencePiece trains, its log (LOG(INFO) ... lines on std::cerr) becomes progress: each
// "Added: freq=F size=N ..." line says N pieces are in the vocabulary. Its other INFO lines and its
// warnings are dropped, as quiet drops them (a failure reaches the user as a zaya::Error); errors
// pass through to the real stderr.
class SentencePieceLogToProgress : public std::streambuf {
 public:
  SentencePieceLogToProgress(std::streambuf* out, TaskProgress& progress) : out_(out), progress_(progress) {}
  ~SentencePieceLogToProgress() override {
    if (!line_.empty()) end_line();
  }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const char ch = static_cast<char>(c);
    xsputn(&ch, 1);
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard<std::mutex> lock(mutex_);  // the trainer's worker threads may log too
    for (std::streamsize i = 0; i < n; ++i) {
      if (s[i] == '\n')
        end_line();
      else
        line_ += s[i];
    }
    return n;
  }
  int sync() override { return 0; }

 private:
  void end_line() {
    // A message starts with "file.cc(line) LOG(LEVEL) " and may span lines (the trainer spec).
    if (line_.find(") LOG(") != std::string::npos)
      dropped_ = line_.find(") LOG(INFO)") != std::string::npos || line_.find(") LOG(WARNING)") != std::string::npos;
    if (dropped_) {
      const size_t added = line_.find("Added: "), size = line_.find(" size=");
      if (added != std::string::npos && size != std::string::npos)
        progress_.update(std::strtoll(line_.c_str() + size + 6, nullptr, 10));
    } else if (!line_.empty()) {
      out_->sputn(line_.data(), static_cast<std::streamsize>(line_.size()));
      out_->sputc('\n');
      out_->pubsync();
    }
    line_.clear();
  }

  std::streambuf* out_;
  TaskProgress& progress_;
  std::mutex mutex_;
  std::string line_;
  bool dropped_ = false;  // the current message is an INFO or WARNING one
};

}  // namespace

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::train(const std::vector<std::string>& lines, const TokenizerTrainOptions& o,
                           std::string* serialized_model) {
  ZAYA_CHECK(o.vocab_size >= 300,
             "--vocab: expected at least 300 (256 byte pieces + 4 special ids + "
             "the corpus's characters), found ",
             o.vocab_size);
  ZAYA_CHECK(!lines.empty(), "tokenizer training: the corpus is empty");
  ZAYA_CHECK(o.num_threads >= 1 && o.num_threads <= 128,  // SentencePiece asserts this range
             "tokenizer training: expected 1 to 128 threads, found ", o.num_threads);
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},         // any byte sequence encodes: no <unk> on unseen characters
      {"character_coverage", "0.9995"},  // rare characters go to bytes instead of taking pieces
      {"pad_id", "0"},
      {"eos_id", "1"},
      {"bos_id", "2"},
      {"unk_id", "3"},
      {"pad_piece", "<pad>"},
      {"eos_piece", "</s>"},
      {"bos_piece", "<s>"},
      {"unk_piece", "<unk>"},
      // Lossless text: no NFKC, no whitespace squeezing, no leading "▁" added.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},  // indentation runs in code become single pieces
      {"split_digits", "true"},
      {"input_sentence_size", std::to_string(o.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(o.num_threads)},
  };
  const int old_level = sentencepiece::logging::GetMinLogLevel();
  if (o.quiet) sentencepiece::logging::SetMinLogLevel(2);  // errors only
  // The seed of SentencePiece's sentence sampling (used when lines > input_sentence_size).
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(o.seed));
  LineIterator it(lines);
  std::string model;
  sentencepiece::util::Status status;
  if (o.quiet && o.progress) {
    TaskProgress progress("data prepare: tokenizer", o.vocab_size, "pieces");
    std::streambuf* const cerr_buf = std::cerr.rdbuf();
    {
      SentencePieceLogToProgress filter(cerr_buf, progress);
      sentencepiece::logging::SetMinLogLevel(0);  // INFO: the lines progress is read from
      std::cerr.rdbuf(&filter);
      try {
        status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
      } catch (...) {
        std::cerr.rdbuf(cerr_buf);
        sentencepiece::logging::SetMinLogLevel(old_level);
        throw;
      }
      std::cerr.rdbuf(cerr_buf);
    }
    if (status.ok()) progress.update(o.vocab_size);
  } else {
    status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  }
  sentencepiece::logging::SetMinLogLevel(old_level);
  if (!status.ok()) {
    const std::string msg = status.message();
    // SentencePiece says "Vocabulary size is too large. Please set it to a value <= N." (or
    // "smaller than required_chars") when the corpus has too few distinct pieces.
    if (msg.find("ocabulary size") != std::string::npos)
      throw Error(
          str("the corpus cannot support a vocabulary of ", o.vocab_size, " (SentencePiece: ", msg, ")"),
          ErrorContext{.field = "--vocab"});
    throw Error(str("tokenizer training failed: ", msg));
  }
  if (serialized_model) *serialized_model = model;
  return from_serialized(model, "<trained>");
}

Tokenizer Tokenizer::load(const std::string& model_file) {
  Tokenizer t;
  t.name_ = model_file;
  auto status = t.sp_->Load(model_file);
  if (!status.ok())
    throw Error(str("cannot load the SentencePiece model: ", status.message()),
                ErrorContext{.file = model_file});
  return t;
}

Tokenizer Tokenizer::from_serialized(const std::string& serialized_model, const std::string& name) {
  Tokenizer t;
  t.name_ = name;
  auto status = t.sp_->LoadFromSerializedProto(serialized_model);
  ZAYA_CHECK(status.ok(), name, ": cannot load the SentencePiece model: ", status.message());
  return t;
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int Tokenizer::pad_id() const { return sp_->pad_id(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }
int Tokenizer::bos_id() const { return sp_->bos_id(); }
int Tokenizer::unk_id() const { return sp_->unk_id(); }

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto status = sp_->Encode(text, &ids);
  ZAYA_CHECK(status.ok(), name_, ": encode failed: ", status.message());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int n = vocab_size();
  for (int32_t id : ids)
    ZAYA_CHECK(id >= 0 && id < n, name_, ": token id ", id, " outside the vocabulary [0, ", n, ")");
  std::string text;
  auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  ZAYA_CHECK(status.ok(), name_, ": decode failed: ", status.message());
  return text;
}

std::string Tokenizer::piece(int id) const {
  ZAYA_CHECK(id >= 0 && id < vocab_size(), name_, ": token id ", id, " outside the vocabulary");
  return sp_->IdToPiece(id);
}

bool Tokenizer::adds_dummy_prefix() const {
  std::vector<std::string> pieces;
  auto status = sp_->Encode("a", &pieces);
  ZAYA_CHECK(status.ok(), name_, ": encode failed: ", status.message());
  return !pieces.empty() && pieces[0].rfind("\xe2\x96\x81", 0) == 0;  // U+2581, SentencePiece's space
}

void Tokenizer::write_vocab(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  for (int i = 0; i < vocab_size(); ++i) out << sp_->IdToPiece(i) << '\t' << sp_->GetScore(i) << '\n';
  out.flush();
  ZAYA_CHECK(out.good(), path, ": write failed");
}

}  // namespace zaya::data
