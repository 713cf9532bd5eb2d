// `data prepare` end to end on a small corpus: outputs, stats, the unigram baseline, errors that
// leave nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "corpus.h"
#include "zaya/core/error.h"
#include "zaya/data/indexed_dataset.h"
#include "zaya/data/prepare.h"
#include "zaya/data/tokenizer.h"

namespace zaya::data {
namespace {
namespace fs = std::filesystem;

class Prepare : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::temp_directory_path() / "zaya_test_data" / (std::string("Prepare.") + info->name())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/in");
    // Input: a text file of blank-line-separated paragraphs and a JSONL file.
    paragraphs_ = testing::make_paragraphs(120, 3);
    std::ofstream txt(dir_ + "/in/a.txt");
    for (size_t i = 0; i < 80; ++i) txt << paragraphs_[i] << "\n";  // blank line after each
    std::ofstream jsonl(dir_ + "/in/b.jsonl");
    for (size_t i = 80; i < paragraphs_.size(); ++i)
      jsonl << nlohmann::json{{"text", paragraphs_[i]}, {"id", i}}.dump() << "\n";
  }
  PrepareOptions options() const {
    PrepareOptions o;
    o.inputs = {dir_ + "/in/a.txt", dir_ + "/in/b.jsonl"};
    o.vocab_size = 400;
    o.out_prefix = dir_ + "/out/p";
    o.val_fraction = 0.2;
    o.doc_split = DocSplit::paragraph;
    o.progress = false;
    fs::create_directories(dir_ + "/out");
    return o;
  }
  std::set<std::string> outputs() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_ + "/out")) names.insert(e.path().filename().string());
    return names;
  }
  std::string dir_;
  std::vector<std::string> paragraphs_;
};

TEST_F(Prepare, EndToEnd) {
  const PrepareOptions o = options();
  const PrepareStats st = prepare(o);
  EXPECT_EQ(outputs(), (std::set<std::string>{"p.model", "p.vocab", "p.json", "p_train.bin", "p_train.idx",
                                              "p_val.bin", "p_val.idx"}));
  EXPECT_EQ(st.train.documents + st.val.documents, 120);
  EXPECT_GT(st.val.documents, 0);
  EXPECT_EQ(st.vocab_size, 400);
  EXPECT_EQ(st.dtype, "uint16");

  // Every document, in input order, lands in the split the documented rule names, and decodes to
  // its text followed by EOS.
  Tokenizer tok = Tokenizer::load(o.out_prefix + ".model");
  IndexedDataset train(o.out_prefix + "_train"), val(o.out_prefix + "_val");
  EXPECT_EQ(train.num_documents(), st.train.documents);
  EXPECT_EQ(train.num_tokens(), st.train.tokens);
  EXPECT_EQ(val.num_tokens(), st.val.tokens);
  const std::vector<bool> is_val = split_documents(120, o.seed, o.val_fraction);
  int64_t ti = 0, vi = 0;
  std::vector<int64_t> train_counts(400), val_counts(400);
  for (int64_t d = 0; d < 120; ++d) {
    std::vector<int32_t> ids = is_val[d] ? val.document(vi++) : train.document(ti++);
    for (int32_t t : ids) ++(is_val[d] ? val_counts : train_counts)[t];
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), 1) << "documents end with EOS";
    ids.pop_back();
    EXPECT_EQ(tok.decode(ids), paragraphs_[d]) << "document " << d;
  }
  EXPECT_EQ(ti, train.num_documents());
  EXPECT_EQ(vi, val.num_documents());

  // The unigram baseline, computed directly: -mean over val tokens of log((c_train + 1) / (N + V)).
  double n_train = 0;
  for (int64_t c : train_counts) n_train += static_cast<double>(c);
  double nll = 0;
  for (int64_t d = 0; d < val.num_documents(); ++d)
    for (int32_t t : val.document(d))
      nll -= std::log((static_cast<double>(train_counts[t]) + 1) / (n_train + 400));
  const double expect = nll / static_cast<double>(val.num_tokens());
  // Tolerance: both sides sum the same terms in double in different orders (relative 1e-12).
  EXPECT_NEAR(st.unigram_baseline, expect, 1e-12 * expect);
  EXPECT_GT(st.unigram_baseline, 1.0);              // context-free prediction of a 400-way vocab...
  EXPECT_LT(st.unigram_baseline, std::log(400.0));  // ...beats the uniform distribution

  std::ifstream js(o.out_prefix + ".json");
  const nlohmann::json j = nlohmann::json::parse(js);
  EXPECT_EQ(j["train"]["tokens"].get<int64_t>(), st.train.tokens);
  EXPECT_EQ(j["val"]["documents"].get<int64_t>(), st.val.documents);
  EXPECT_EQ(j["tokenizer"]["eos_id"].get<int>(), 1);
  EXPECT_DOUBLE_EQ(j["unigram_baseline_nats_per_token"].get<double>(), st.unigram_baseline);
}

TEST_F(Prepare, ExistingTokenizerAndFileDocuments) {
  PrepareOptions o = options();
  prepare(o);
  PrepareOptions o2 = o;
  o2.vocab_size = 0;
  o2.tokenizer_model = o.out_prefix + ".model";
  o2.out_prefix = dir_ + "/out/q";
  o2.doc_split = DocSplit::file;
  const PrepareStats st = prepare(o2);
  // a.txt is one document; b.jsonl still gives one document per line.
  EXPECT_EQ(st.train.documents + st.val.documents, 1 + 40);
  EXPECT_EQ(st.vocab_size, 400);
}

// A single text file (one document under the default --doc-split file) used to stop with "the
// input holds 1 document(s)"; its tail now becomes the validation split, cut at a line start.
TEST_F(Prepare, OneTextFileIsCutIntoTrainingAndValidationText) {
  std::string text;
  for (const std::string& p : paragraphs_) text += p + "\n";
  std::ofstream(dir_ + "/in/one.txt") << text;
  PrepareOptions o = options();
  o.inputs = {dir_ + "/in/one.txt"};
  o.doc_split = DocSplit::file;
  o.val_fraction = 0.1;
  const PrepareStats st = prepare(o);
  ASSERT_TRUE(st.single_document_cut);
  EXPECT_EQ(st.cut_source, dir_ + "/in/one.txt");
  EXPECT_EQ(st.train.documents, 1);
  EXPECT_EQ(st.val.documents, 1);
  // The cut is the first line start at or after 90% of the bytes.
  const size_t target = static_cast<size_t>(std::floor((1.0 - o.val_fraction) * static_cast<double>(text.size())));
  const size_t cut = static_cast<size_t>(st.cut.byte);
  ASSERT_GE(cut, target);
  EXPECT_EQ(text[cut - 1], '\n');
  EXPECT_EQ(text.find('\n', target - 1), cut - 1);
  EXPECT_EQ(st.cut.line, 1 + std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(cut), '\n'));

  // The two documents decode to the text before and after the cut, each followed by EOS.
  Tokenizer tok = Tokenizer::load(o.out_prefix + ".model");
  IndexedDataset train(o.out_prefix + "_train"), val(o.out_prefix + "_val");
  std::vector<int32_t> t = train.document(0), v = val.document(0);
  ASSERT_EQ(t.back(), 1);
  ASSERT_EQ(v.back(), 1);
  t.pop_back();
  v.pop_back();
  EXPECT_EQ(tok.decode(t), text.substr(0, cut));
  EXPECT_EQ(tok.decode(v), text.substr(cut));

  std::ifstream js(o.out_prefix + ".json");
  const nlohmann::json j = nlohmann::json::parse(js);
  EXPECT_EQ(j["single_document_cut"]["byte"].get<int64_t>(), st.cut.byte);
  EXPECT_EQ(j["single_document_cut"]["line"].get<int64_t>(), st.cut.line);
}

TEST_F(Prepare, SeveralDocumentsAreNotCut) {
  const PrepareStats st = prepare(options());
  EXPECT_FALSE(st.single_document_cut);
  std::ifstream js(options().out_prefix + ".json");
  EXPECT_FALSE(nlohmann::json::parse(js).contains("single_document_cut"));
}

TEST_F(Prepare, TheCutIsAtALineStartWithTextOnBothSides) {
  // 10 lines of 10 bytes: 90% of 100 bytes is byte 90, the start of line 10.
  std::string ten;
  for (int i = 0; i < 10; ++i) ten += "line " + std::to_string(i) + "...\n";
  ASSERT_EQ(ten.size(), 100u);
  DocumentCut c = cut_single_document(ten, 0.1, "ten");
  EXPECT_EQ(c.byte, 90);
  EXPECT_EQ(c.line, 10);
  c = cut_single_document(ten, 0.15, "ten");  // byte 85 is inside line 9: the next line start
  EXPECT_EQ(c.byte, 90);
  // Blank lines at the end are not text: the cut moves back to the last line with text after it.
  c = cut_single_document("first line\nsecond line\n\n\n  \n\n\n\n\n\n\n\n\n\n", 0.1, "blank tail");
  EXPECT_EQ(c.byte, 11);
  EXPECT_EQ(c.line, 2);
  // A long last line: the only usable line start is before the target.
  c = cut_single_document("a\n" + std::string(200, 'b'), 0.05, "long");
  EXPECT_EQ(c.byte, 2);
  // Leading blank lines do not count as training text.
  c = cut_single_document("\n\n\nonly\nlines\n", 0.9, "lead");
  EXPECT_EQ(c.byte, 8);
  try {
    cut_single_document("\n  one line of text  \n\n", 0.1, "single.txt");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("single.txt: the input is one document with a single line"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Prepare, OneLineOfTextIsAnErrorAndLeavesNothing) {
  std::ofstream(dir_ + "/in/line.txt") << "just one line, nothing to cut\n";
  PrepareOptions o = options();
  o.inputs = {dir_ + "/in/line.txt"};
  EXPECT_THROW(prepare(o), Error);
  EXPECT_TRUE(outputs().empty());
}

TEST_F(Prepare, SplitRuleIsDeterministicAndNearTheFraction) {
  int64_t n_val = 0;
  for (int64_t i = 0; i < 100000; ++i) n_val += is_validation_document(7, i, 0.1);
  // Binomial(1e5, 0.1): standard deviation ~95; 5 sigma.
  EXPECT_NEAR(static_cast<double>(n_val), 10000.0, 475.0);
  EXPECT_EQ(split_documents(1000, 7, 0.1), split_documents(1000, 7, 0.1));
  EXPECT_NE(split_documents(1000, 7, 0.1), split_documents(1000, 8, 0.1));
  const std::vector<bool> two = split_documents(2, 7, 0.01);
  EXPECT_NE(two[0], two[1]);  // tiny corpora still get both splits
}

TEST_F(Prepare, MissingInputIsAnErrorAndLeavesNothing) {
  PrepareOptions o = options();
  o.inputs.push_back(dir_ + "/in/missing.txt");
  try {
    prepare(o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt: input file not found"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(outputs().empty());
}

TEST_F(Prepare, EmptyInputIsAnErrorAndLeavesNothing) {
  PrepareOptions o = options();
  std::ofstream(dir_ + "/in/empty.txt").flush();
  o.inputs.push_back(dir_ + "/in/empty.txt");
  try {
    prepare(o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty.txt: input file is empty"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(outputs().empty());
}

TEST_F(Prepare, VocabularyTooLargeIsAnErrorAndLeavesNothing) {
  PrepareOptions o = options();
  o.vocab_size = 30000;
  try {
    prepare(o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot support"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(outputs().empty());
}

TEST_F(Prepare, BadJsonlIsAnErrorNamingTheLine) {
  PrepareOptions o = options();
  std::ofstream(dir_ + "/in/c.jsonl") << "{\"text\": \"ok\"}\n{\"body\": \"no text field\"}\n";
  o.inputs = {dir_ + "/in/c.jsonl"};
  try {
    prepare(o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.jsonl:2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(outputs().empty());
}

TEST_F(Prepare, DirectoriesAndGlobsExpandSorted) {
  std::ofstream(dir_ + "/in/z.txt") << "zzz\n";
  EXPECT_EQ(resolve_inputs({dir_ + "/in"}),
            (std::vector<std::string>{dir_ + "/in/a.txt", dir_ + "/in/b.jsonl", dir_ + "/in/z.txt"}));
  EXPECT_EQ(resolve_inputs({dir_ + "/in/*.txt"}),
            (std::vector<std::string>{dir_ + "/in/a.txt", dir_ + "/in/z.txt"}));
  EXPECT_THROW(resolve_inputs({dir_ + "/in/*.none"}), Error);
}

}  // namespace
}  // namespace zaya::data
