// `zaya data prepare`: text / JSONL files -> a SentencePiece model and Megatron train/val datasets.
//
// Outputs (all written to temporaries and renamed only when everything succeeded, so a failure
// leaves nothing behind): PREFIX.model, PREFIX.vocab, PREFIX_train.bin/.idx, PREFIX_val.bin/.idx,
// PREFIX.json (stats). Rules are in docs/data.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zaya::data {

enum class DocSplit { file, paragraph };  // one document per file, or per blank-line paragraph
DocSplit parse_doc_split(const std::string& name);

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, directories (recursive) or glob patterns
  int vocab_size = 0;               // train a tokenizer with this vocabulary ...
  std::string tokenizer_model;      // ... or use this existing .model (exactly one of the two)
  std::string out_prefix;
  double val_fraction = 0.05;
  DocSplit doc_split = DocSplit::file;
  std::string jsonl_field = "text";  // the document field of .jsonl / .json lines
  uint64_t seed = 1234;              // train/val split and tokenizer sampling
  int64_t input_sentence_size = 1000000;
  int threads = 2;
  bool progress = true;  // log progress lines
};

struct SplitStats {
  int64_t documents = 0;
  int64_t tokens = 0;  // including one EOS per document
};

// Where the text of a lone document is cut into its training and validation parts.
struct DocumentCut {
  int64_t byte = 0;  // the validation part starts here, at the start of a line
  int64_t line = 0;  // that line's number (1-based) within the document
};

struct PrepareStats {
  SplitStats train, val;
  // The inputs held one document, cut in two at `cut` (docs/data.md: one document) instead of
  // split by documents; `cut_source` names where the document came from.
  bool single_document_cut = false;
  DocumentCut cut;
  std::string cut_source;
  int vocab_size = 0;
  std::string dtype;
  int64_t input_files = 0;
  int64_t input_bytes = 0;
  // Bytes of the inputs that are not valid UTF-8 (a warning names the first), and where the first
  // is ("FILE byte N (line L)"; empty when there are none).
  int64_t invalid_utf8_bytes = 0;
  std::string first_invalid_utf8;
  // Cross-entropy (nats/token) of add-one-smoothed training unigram frequencies on the
  // validation tokens: the loss of a model that ignores context entirely.
  double unigram_baseline = 0.0;
  double tokenizer_seconds = 0.0;
  double total_seconds = 0.0;
};

// A document to tokenize: its text and where it came from (for error messages).
struct Document {
  std::string text;
  std::string source;
};

// What a text holds besides valid UTF-8. SentencePiece replaces every byte that is not part of a
// well-formed UTF-8 sequence with U+FFFD, so such bytes do not survive tokenization.
struct Utf8Report {
  int64_t invalid_bytes = 0;   // bytes outside well-formed sequences (Unicode 3.9, table 3-7)
  int64_t first_invalid = -1;  // byte offset of the first one, -1 for none
  int64_t first_line = 0;      // its line (1-based)
  int64_t text_bytes = 0;      // bytes of valid sequences other than ASCII whitespace
};
Utf8Report check_utf8(const std::string& text);

// Expands inputs (files, directories, globs) into a sorted list of files; a missing input or an
// empty file is a zaya::Error naming it.
std::vector<std::string> resolve_inputs(const std::vector<std::string>& inputs);
// Reads documents from one file: JSONL (extension .jsonl) by `jsonl_field`, else text split by
// `split`. Empty documents (whitespace only) are dropped. With `utf8`, reports the file's bytes.
std::vector<Document> read_documents(const std::string& file, DocSplit split, const std::string& jsonl_field,
                                     Utf8Report* utf8 = nullptr);
// true if document `index` belongs to the validation split (docs/data.md: the split rule).
bool is_validation_document(uint64_t seed, int64_t index, double val_fraction);
// Assigns every document to a split; guarantees a non-empty validation split when there are at
// least two documents (throws if fewer).
std::vector<bool> split_documents(int64_t num_documents, uint64_t seed, double val_fraction);
// Where a lone document is cut (docs/data.md: one document): at the first line start at or after
// (1 - val_fraction) of its bytes with non-blank text on both sides, else at the last such line
// start before it. A text without such a line start (one non-blank line) is a zaya::Error naming
// `source`.
DocumentCut cut_single_document(const std::string& text, double val_fraction, const std::string& source);
// Cross-entropy in nats/token of add-one-smoothed unigram counts on `val_counts`.
double unigram_cross_entropy(const std::vector<int64_t>& train_counts,
                             const std::vector<int64_t>& val_counts);

PrepareStats prepare(const PrepareOptions& options);

}  // namespace zaya::data
