// `zaya data prepare` and `zaya data inspect`: command-line wiring over zaya::data.
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "zaya/core/error.h"
#include "zaya/data/indexed_dataset.h"
#include "zaya/data/prepare.h"
#include "zaya/data/token_range.h"
#include "zaya/data/tokenizer.h"

namespace zaya::app {
namespace {

struct DataArgs {
  data::PrepareOptions prepare;
  std::string doc_split = "file";
  std::string inspect_prefix;
  std::string inspect_model;
  int inspect_docs = 3;
  bool dump_ids = false;
};

// What `prepare` did with an input of one document (docs/data.md), or nothing.
std::string cut_note(const data::PrepareStats& s) {
  if (!s.single_document_cut) return "";
  const int64_t bytes = s.input_bytes, val = bytes - s.cut.byte;
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%", 100.0 * static_cast<double>(val) / static_cast<double>(bytes));
  return str("split:        the input is one document (", s.cut_source, "), so its lines from ", s.cut.line,
             " (the last ", val, " bytes, ", share,
             ") are the validation split and the lines before it the training split; give several files, "
             "JSONL lines or --doc-split paragraph to split by documents instead\n");
}

int run_prepare(const DataArgs& a) {
  data::PrepareOptions o = a.prepare;
  o.doc_split = data::parse_doc_split(a.doc_split);
  const data::PrepareStats s = data::prepare(o);
  std::cout << "inputs:       " << s.input_files << " files, " << s.input_bytes << " bytes\n"
            << "tokenizer:    vocab " << s.vocab_size << " (" << s.dtype << " tokens), " << std::fixed
            << std::setprecision(1) << s.tokenizer_seconds << " s\n"
            << "train:        " << s.train.documents << " documents, " << s.train.tokens << " tokens -> "
            << o.out_prefix << "_train.bin/.idx\n"
            << "val:          " << s.val.documents << " documents, " << s.val.tokens << " tokens -> "
            << o.out_prefix << "_val.bin/.idx\n"
            << cut_note(s) << std::setprecision(4) << "unigram baseline: " << s.unigram_baseline
            << " nats/token (cross-entropy of train unigram frequencies on val)\n"
            << std::setprecision(1) << "total:        " << s.total_seconds << " s; stats in " << o.out_prefix
            << ".json\n";
  return 0;
}

int run_inspect(const DataArgs& a) {
  data::IndexedDataset ds(a.inspect_prefix);
  if (a.dump_ids) {  // the whole token stream, one document per line (format tests compare this)
    for (int64_t d = 0; d < ds.num_documents(); ++d) {
      const std::vector<int32_t> ids = ds.document(d);
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << "\n";
    }
    return 0;
  }
  std::cout << "dataset:   " << a.inspect_prefix << "\n"
            << "dtype:     " << data::token_dtype_name(ds.dtype()) << " (code "
            << static_cast<int>(ds.dtype()) << ")\n"
            << "documents: " << ds.num_documents() << "\n"
            << "sequences: " << ds.num_sequences() << "\n"
            << "tokens:    " << ds.num_tokens() << "\n";
  const data::TokenRange range = data::token_range(ds);
  if (range.max_id >= range.min_id) std::cout << "token ids: " << range.min_id << ".." << range.max_id << "\n";
  std::unique_ptr<data::Tokenizer> tok;
  if (!a.inspect_model.empty())
    tok = std::make_unique<data::Tokenizer>(data::Tokenizer::load(a.inspect_model));
  const int64_t show = std::min<int64_t>(a.inspect_docs, ds.num_documents());
  for (int64_t d = 0; d < show; ++d) {
    std::vector<int32_t> ids = ds.document(d);
    const size_t n = std::min<size_t>(ids.size(), 32);
    std::cout << "doc " << d << " (" << ids.size() << " tokens):";
    for (size_t i = 0; i < n; ++i) std::cout << " " << ids[i];
    if (n < ids.size()) std::cout << " ...";
    std::cout << "\n";
    if (tok) {
      ids.resize(n);
      std::cout << "  text: " << std::quoted(tok->decode(ids)) << "\n";
    }
  }
  return 0;
}

void add_data(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<DataArgs>();
  auto* data_cmd = app.add_subcommand(
      "data", "Prepare and inspect tokenized datasets (SentencePiece + Megatron .bin/.idx)");
  data_cmd->require_subcommand(1);

  auto* prep = data_cmd->add_subcommand("prepare", "Tokenize text/JSONL into Megatron train/val datasets");
  auto& o = args->prepare;
  prep->add_option("--input", o.inputs,
                   "Input files, directories (recursive) or glob patterns; .jsonl reads --jsonl-field")
      ->required();
  auto* vocab =
      prep->add_option("--vocab", o.vocab_size, "Train a SentencePiece BPE model with this vocabulary");
  auto* model = prep->add_option("--tokenizer", o.tokenizer_model, "Use this existing SentencePiece .model");
  vocab->excludes(model);
  prep->add_option("--out", o.out_prefix,
                   "Output prefix: PREFIX.model/.vocab/.json, PREFIX_{train,val}.bin/.idx")
      ->required();
  prep->add_option("--val-fraction", o.val_fraction, "Fraction of documents in the validation split")
      ->capture_default_str();
  prep->add_option("--doc-split", args->doc_split,
                   "file: one document per file; paragraph: per blank-line paragraph")
      ->capture_default_str();
  prep->add_option("--jsonl-field", o.jsonl_field, "Document field of JSONL lines")->capture_default_str();
  prep->add_option("--seed", o.seed, "Seed for the split and tokenizer sampling")->capture_default_str();
  prep->add_option("--input-sentence-size", o.input_sentence_size,
                   "Max lines SentencePiece samples for training")
      ->capture_default_str();
  prep->add_option("--tokenizer-threads", o.threads, "Threads for training and encoding")
      ->capture_default_str();
  prep->add_flag("!--no-progress", o.progress,
                 "no progress lines (the tokenizer's pieces, files read, documents tokenized) on stderr");

  auto* insp = data_cmd->add_subcommand("inspect", "Counts, dtype and the first tokens of a dataset PREFIX");
  insp->add_option("prefix", args->inspect_prefix, "Dataset prefix (PREFIX.bin/.idx)")->required();
  insp->add_option("--tokenizer", args->inspect_model, "SentencePiece .model to decode the shown tokens");
  insp->add_option("--docs", args->inspect_docs, "Documents to show")->capture_default_str();
  insp->add_flag("--dump-ids", args->dump_ids, "Print every document's token ids, one document per line");

  commands.push_back({data_cmd, [args, prep, insp]() -> int {
                        if (prep->parsed()) {
                          if (args->prepare.vocab_size <= 0 && args->prepare.tokenizer_model.empty())
                            throw Error("data prepare: expected --vocab N or --tokenizer MODEL");
                          return run_prepare(*args);
                        }
                        if (insp->parsed()) return run_inspect(*args);
                        return 2;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(data, zaya::app::add_data);
