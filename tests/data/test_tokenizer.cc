// SentencePiece wrapper: train on a small corpus, special ids, lossless encode/decode, errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "corpus.h"
#include "zaya/core/error.h"
#include "zaya/data/tokenizer.h"

namespace zaya::data {
namespace {

std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  for (const std::string& p : testing::make_paragraphs(300, 7)) {
    std::istringstream in(p);
    std::string l;
    while (std::getline(in, l)) lines.push_back(l);
  }
  return lines;
}

// One trained tokenizer shared by the tests below (training is the slow part).
const Tokenizer& trained() {
  static Tokenizer* tok = [] {
    std::string model;
    auto* t = new Tokenizer(Tokenizer::train(corpus_lines(), {.vocab_size = 400}, &model));
    EXPECT_FALSE(model.empty());
    return t;
  }();
  return *tok;
}

TEST(Tokenizer, TrainedModelHasTheDocumentedSpecialIds) {
  const Tokenizer& t = trained();
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.unk_id(), 3);
  EXPECT_EQ(t.piece(0), "<pad>");
  EXPECT_EQ(t.piece(1), "</s>");
}

TEST(Tokenizer, EncodeDecodeIsLossless) {
  const Tokenizer& t = trained();
  // Seen words, unseen characters (byte fallback: CJK, emoji, control characters), whitespace
  // runs, leading spaces and newlines must all survive exactly.
  for (const std::string& text :
       {std::string("the model returns a value.\n"), std::string("  two  spaces\n\n\tand a tab "),
        std::string("日本語 and 🙂 emoji"), std::string("def f():\n    return None\n"),
        std::string("\x01\x7f bytes"), std::string("")}) {
    const std::vector<int32_t> ids = t.encode(text);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, t.vocab_size());
      EXPECT_NE(id, t.unk_id()) << "byte fallback should make <unk> impossible: " << text;
    }
    EXPECT_EQ(t.decode(ids), text);
  }
}

TEST(Tokenizer, CompressesTrainingText) {
  // BPE merges make frequent words single pieces: a corpus sentence takes far fewer tokens than
  // bytes (bound chosen loosely: merges on this corpus give about 4 bytes per token).
  const Tokenizer& t = trained();
  const std::string text = "the model returns the value of the function";
  EXPECT_LT(t.encode(text).size() * 2, text.size());
}

TEST(Tokenizer, SerializedModelLoadsFromFile) {
  std::string model;
  Tokenizer a = Tokenizer::train(corpus_lines(), {.vocab_size = 350}, &model);
  const auto path = std::filesystem::temp_directory_path() / ("zaya_test_tokenizer_" + std::to_string(getpid()) + ".model");
  std::ofstream(path, std::ios::binary) << model;
  Tokenizer b = Tokenizer::load(path.string());
  const std::string text = "import os\nprint(x) with über naïve";
  EXPECT_EQ(a.encode(text), b.encode(text));
  EXPECT_EQ(b.vocab_size(), 350);
  std::filesystem::remove(path);
}

TEST(Tokenizer, VocabularyTooLargeForTheCorpusIsAClearError) {
  try {
    Tokenizer::train(corpus_lines(), {.vocab_size = 20000});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot support"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, BadInputsAreErrors) {
  EXPECT_THROW(Tokenizer::train({}, {.vocab_size = 400}), Error);
  EXPECT_THROW(Tokenizer::train(corpus_lines(), {.vocab_size = 100}), Error);
  EXPECT_THROW(Tokenizer::load("/nonexistent/zaya.model"), Error);
  EXPECT_THROW(trained().decode({5, 400}), Error);
}

}  // namespace
}  // namespace zaya::data
