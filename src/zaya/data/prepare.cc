#include "zaya/data/prepare.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/core/log.h"
#include "zaya/core/threads.h"
#include "zaya/data/hash.h"
#include "zaya/data/indexed_dataset.h"
#include "zaya/data/tokenizer.h"

namespace zaya::data {
namespace fs = std::filesystem;
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZAYA_CHECK(in.good(), path, ": cannot open input file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Temporary outputs: removed on destruction unless commit() renamed them to their final names.
class TempFiles {
 public:
  std::string add(const std::string& final_path) {
    finals_.push_back(final_path);
    return final_path + ".tmp";
  }
  void commit() {
    for (const auto& f : finals_) {
      std::error_code ec;
      fs::rename(f + ".tmp", f, ec);
      ZAYA_CHECK(!ec, f, ": cannot rename the finished output into place: ", ec.message());
    }
    committed_ = true;
  }
  ~TempFiles() {
    if (committed_) return;
    for (const auto& f : finals_) std::remove((f + ".tmp").c_str());
  }

 private:
  std::vector<std::string> finals_;
  bool committed_ = false;
};

}  // namespace

DocSplit parse_doc_split(const std::string& name) {
  if (name == "file") return DocSplit::file;
  if (name == "paragraph") return DocSplit::paragraph;
  throw Error("unknown document split",
              ErrorContext{.field = "--doc-split", .expected = "file or paragraph", .found = name});
}

std::vector<std::string> resolve_inputs(const std::vector<std::string>& inputs) {
  ZAYA_CHECK(!inputs.empty(), "--input: expected at least one file, directory or glob");
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    std::vector<std::string> found;
    if (fs::is_directory(in, ec)) {
      for (const auto& e :
           fs::recursive_directory_iterator(in, fs::directory_options::follow_directory_symlink))
        if (e.is_regular_file()) found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      ZAYA_CHECK(!found.empty(), in, ": input directory holds no files");
    } else if (fs::exists(in, ec)) {
      found.push_back(in);
    } else if (in.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      if (::glob(in.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) found.push_back(g.gl_pathv[i]);  // glob sorts
      ::globfree(&g);
      ZAYA_CHECK(!found.empty(), in, ": no input file matches this pattern");
    } else {
      throw Error("input file not found", ErrorContext{.file = in});
    }
    for (const auto& f : found) {
      ZAYA_CHECK(fs::is_regular_file(f, ec), f, ": input is not a regular file");
      ZAYA_CHECK(fs::file_size(f, ec) > 0, f, ": input file is empty");
    }
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

Utf8Report check_utf8(const std::string& text) {
  Utf8Report r;
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  int64_t line = 1;
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    // Well-formed sequences (Unicode 3.9, table 3-7): the lead byte fixes the length and the range
    // of the second byte (no overlongs, surrogates or code points past U+10FFFF).
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned t = b[i + k];
      ok = k == 1 ? (t >= lo && t <= hi) : (t >= 0x80 && t <= 0xBF);
    }
    if (!ok) {  // one invalid byte; decoding resumes at the next
      if (r.invalid_bytes++ == 0) r.first_invalid = static_cast<int64_t>(i), r.first_line = line;
      ++i;
      continue;
    }
    if (c == '\n') ++line;
    if (len > 1 || !std::isspace(static_cast<int>(c))) r.text_bytes += static_cast<int64_t>(len);
    i += len;
  }
  return r;
}

std::vector<Document> read_documents(const std::string& file, DocSplit split,
                                     const std::string& jsonl_field, Utf8Report* utf8) {
  const std::string text = read_file(file);
  if (utf8) *utf8 = check_utf8(text);
  std::vector<Document> docs;
  if (ends_with(file, ".jsonl")) {
    std::istringstream lines(text);
    std::string line;
    for (int64_t n = 1; std::getline(lines, line); ++n) {
      if (is_blank(line)) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error(str("not valid JSON: ", e.what()), ErrorContext{.file = str(file, ":", n)});
      }
      ZAYA_CHECK(j.is_object() && j.contains(jsonl_field) && j[jsonl_field].is_string(), file, ":", n,
                 ": expected an object with a string field '", jsonl_field, "'");
      std::string t = j[jsonl_field].get<std::string>();
      if (!is_blank(t)) docs.push_back({std::move(t), str(file, ":", n)});
    }
  } else if (split == DocSplit::file) {
    if (!is_blank(text)) docs.push_back({text, file});
  } else {
    // Paragraphs: runs of non-blank lines; blank lines (whitespace only) separate them.
    std::istringstream lines(text);
    std::string line, para;
    int64_t n = 0, start = 1;
    auto flush = [&] {
      if (!para.empty()) docs.push_back({std::move(para), str(file, ":", start)});
      para.clear();
    };
    while (std::getline(lines, line)) {
      ++n;
      if (is_blank(line)) {
        flush();
        continue;
      }
      if (para.empty()) start = n;
      para += line;
      para += '\n';
    }
    flush();
  }
  ZAYA_CHECK(!docs.empty(), file, ": input file holds no documents (only whitespace)");
  return docs;
}

bool is_validation_document(uint64_t seed, int64_t index, double val_fraction) {
  // u in [0, 1) from the top 53 bits of a mix of (seed, index): document i is validation iff u < f.
  const uint64_t h = mix64(mix64(seed) ^ static_cast<uint64_t>(index));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < val_fraction;
}

std::vector<bool> split_documents(int64_t n, uint64_t seed, double f) {
  ZAYA_CHECK(f > 0.0 && f < 1.0, "--val-fraction: expected a value in (0, 1), found ", f);
  ZAYA_CHECK(n >= 2, "the input holds ", n, " document(s); a train/validation split needs at least 2");
  std::vector<bool> val(static_cast<size_t>(n));
  int64_t nval = 0;
  for (int64_t i = 0; i < n; ++i) nval += val[i] = is_validation_document(seed, i, f);
  // Tiny corpora: keep both splits non-empty, moving the lowest-index document across.
  if (nval == 0) val[0] = true;
  if (nval == n) val[0] = false;
  return val;
}

DocumentCut cut_single_document(const std::string& text, double f, const std::string& source) {
  ZAYA_CHECK(f > 0.0 && f < 1.0, "--val-fraction: expected a value in (0, 1), found ", f);
  const auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  const auto first = std::find_if_not(text.begin(), text.end(), blank);
  const auto last = std::find_if_not(text.rbegin(), text.rend(), blank);
  // A line start p (text[p - 1] is a newline) leaves non-blank text on both sides iff
  // first_text < p <= last_text.
  const size_t first_text = first == text.end() ? text.size() : static_cast<size_t>(first - text.begin());
  const size_t last_text =
      last == text.rend() ? 0 : text.size() - 1 - static_cast<size_t>(last - text.rbegin());
  const auto usable = [&](size_t p) { return p > first_text && p <= last_text; };
  const size_t target =
      std::max<size_t>(1, static_cast<size_t>(std::floor((1.0 - f) * static_cast<double>(text.size()))));
  size_t cut = 0;
  for (size_t nl = text.find('\n', target - 1); nl != std::string::npos && nl + 1 <= last_text;
       nl = text.find('\n', nl + 1))
    if (usable(nl + 1)) {
      cut = nl + 1;
      break;
    }
  for (size_t nl = target - 1; cut == 0 && nl > 0;) {  // none at or after the target: look before it
    nl = text.rfind('\n', nl - 1);
    if (nl == std::string::npos || nl + 1 <= first_text) break;
    if (usable(nl + 1)) cut = nl + 1;
  }
  ZAYA_CHECK(cut > 0, source,
             ": the input is one document with a single line of text; a train/validation split needs at least "
             "2 documents (more input files, JSONL lines or --doc-split paragraph) or a line to cut at");
  const auto lines_before = std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(cut), '\n');
  return {.byte = static_cast<int64_t>(cut), .line = 1 + static_cast<int64_t>(lines_before)};
}

double unigram_cross_entropy(const std::vector<int64_t>& train_counts,
                             const std::vector<int64_t>& val_counts) {
  ZAYA_ASSERT(train_counts.size() == val_counts.size());
  const double v = static_cast<double>(train_counts.size());
  double n_train = 0, n_val = 0, nll = 0;
  for (int64_t c : train_counts) n_train += static_cast<double>(c);
  for (size_t t = 0; t < val_counts.size(); ++t) {
    if (val_counts[t] == 0) continue;
    // Add-one smoothing: a token never seen in training still has a finite probability.
    const double p = (static_cast<double>(train_counts[t]) + 1.0) / (n_train + v);
    nll -= static_cast<double>(val_counts[t]) * std::log(p);
    n_val += static_cast<double>(val_counts[t]);
  }
  return n_val > 0 ? nll / n_val : 0.0;
}

PrepareStats prepare(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  ZAYA_CHECK((o.vocab_size > 0) != !o.tokenizer_model.empty(),
             "data prepare: expected exactly one of --vocab N or --tokenizer MODEL");
  ZAYA_CHECK(!o.out_prefix.empty(), "--out: expected an output prefix");
  // SentencePiece's trainer accepts 1..128 threads (and asserts otherwise).
  ZAYA_CHECK(o.threads >= 1 && o.threads <= std::min(128, max_num_threads()),
             "--tokenizer-threads: expected a thread count in [1, ", std::min(128, max_num_threads()), "], found ",
             o.threads);
  ZAYA_CHECK(o.val_fraction > 0.0 && o.val_fraction < 1.0,
             "--val-fraction: expected a value in (0, 1), found ", o.val_fraction);
  {
    // The prefix's directory is made as needed (`--out data/mycorpus` in a fresh directory works).
    fs::path parent = fs::path(o.out_prefix).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::exists(parent, ec)) fs::create_directories(parent, ec);
    ZAYA_CHECK(parent.empty() || fs::is_directory(parent, ec), "--out ", o.out_prefix, ": ", parent.string(),
               ec ? " cannot be created: " + ec.message() : std::string(" is not a directory"));
  }
  PrepareStats st;

  // 1. Documents, in input order.
  const std::vector<std::string> files = resolve_inputs(o.inputs);
  std::vector<Document> docs;
  int64_t text_bytes = 0, invalid_files = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    Utf8Report utf8;
    std::vector<Document> d = read_documents(files[i], o.doc_split, o.jsonl_field, &utf8);
    text_bytes += utf8.text_bytes;
    if (utf8.invalid_bytes > 0) {
      if (st.invalid_utf8_bytes == 0)
        st.first_invalid_utf8 = str(files[i], " byte ", utf8.first_invalid, " (line ", utf8.first_line, ")");
      st.invalid_utf8_bytes += utf8.invalid_bytes;
      ++invalid_files;
    }
    for (auto& x : d) st.input_bytes += static_cast<int64_t>(x.text.size());
    docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
    if (o.progress && (i + 1) % 100 == 0)
      log_info("data prepare: read ", i + 1, "/", files.size(), " files, ", docs.size(), " documents");
  }
  st.input_files = static_cast<int64_t>(files.size());
  // SentencePiece turns every invalid byte into U+FFFD: an input that is not UTF-8 at all (another
  // encoding, binary data) leaves it nothing to learn, and it would fail with an internal check.
  ZAYA_CHECK(text_bytes > 0, "--input: no valid UTF-8 text in the inputs (", st.invalid_utf8_bytes,
             " invalid bytes, the first at ", st.first_invalid_utf8,
             "); convert them to UTF-8 first (e.g. iconv -f latin1 -t utf-8)");
  if (st.invalid_utf8_bytes > 0)
    log_warn("data prepare: ", st.invalid_utf8_bytes, " bytes of invalid UTF-8 in ", invalid_files,
             " input file(s), the first at ", st.first_invalid_utf8,
             "; the tokenizer reads each as U+FFFD, so decoding will not restore them");
  std::vector<bool> is_val;
  if (docs.size() == 1) {
    // One document (a single text file, the usual first corpus): its tail is the validation split.
    st.cut = cut_single_document(docs[0].text, o.val_fraction, docs[0].source);
    st.single_document_cut = true;
    st.cut_source = docs[0].source;
    Document val{docs[0].text.substr(static_cast<size_t>(st.cut.byte)),
                 str(docs[0].source, " from line ", st.cut.line)};
    docs[0].text.resize(static_cast<size_t>(st.cut.byte));
    docs.push_back(std::move(val));
    is_val = {false, true};
    if (o.progress)
      log_info("data prepare: one document (", st.cut_source, "): lines from ", st.cut.line,
               " are the validation split");
  } else {
    is_val = split_documents(static_cast<int64_t>(docs.size()), o.seed, o.val_fraction);
  }
  if (o.progress)
    log_info("data prepare: ", files.size(), " files, ", docs.size(), " documents, ", st.input_bytes,
             " bytes");

  // 2. Tokenizer: trained on the training split's lines only, so validation stays unseen.
  TempFiles temps;
  const std::string model_path = o.out_prefix + ".model", vocab_path = o.out_prefix + ".vocab";
  std::string model_bytes;
  const auto t_tok = std::chrono::steady_clock::now();
  Tokenizer tok;
  if (o.vocab_size > 0) {
    std::vector<std::string> lines;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (is_val[i]) continue;
      std::istringstream in(docs[i].text);
      std::string line;
      while (std::getline(in, line))
        if (!is_blank(line)) lines.push_back(std::move(line));
    }
    if (o.progress)
      log_info("data prepare: training SentencePiece BPE, vocab ", o.vocab_size, " on ", lines.size(),
               " lines");
    TokenizerTrainOptions to{.vocab_size = o.vocab_size,
                             .input_sentence_size = o.input_sentence_size,
                             .num_threads = o.threads,
                             .seed = o.seed,
                             .progress = o.progress};
    tok = Tokenizer::train(lines, to, &model_bytes);
  } else {
    tok = Tokenizer::load(o.tokenizer_model);
    model_bytes = read_file(o.tokenizer_model);
  }
  st.tokenizer_seconds = seconds_since(t_tok);
  ZAYA_CHECK(tok.eos_id() >= 0, o.tokenizer_model, ": the tokenizer has no EOS id; documents need one");
  st.vocab_size = tok.vocab_size();
  const TokenDtype dtype = token_dtype_for_vocab(st.vocab_size);
  st.dtype = token_dtype_name(dtype);
  if (o.progress)
    log_info("data prepare: tokenizer ready (vocab ", st.vocab_size, ", ", st.tokenizer_seconds, " s)");

  // 3. Encode in chunks (parallel over documents), write in document order.
  const std::string train_prefix = o.out_prefix + "_train", val_prefix = o.out_prefix + "_val";
  const std::string train_bin = temps.add(bin_path(train_prefix)),
                    train_idx = temps.add(idx_path(train_prefix));
  const std::string val_bin = temps.add(bin_path(val_prefix)), val_idx = temps.add(idx_path(val_prefix));
  IndexedDatasetWriter train_w(train_bin, train_idx, dtype), val_w(val_bin, val_idx, dtype);
  std::vector<int64_t> train_counts(static_cast<size_t>(st.vocab_size)),
      val_counts(static_cast<size_t>(st.vocab_size));
  constexpr int64_t kChunk = 2048;
  const int64_t n = static_cast<int64_t>(docs.size());
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(c1 - c0));
    std::vector<std::string> errors(static_cast<size_t>(c1 - c0));  // exceptions must not leave OpenMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(1, o.threads))
    for (int64_t i = c0; i < c1; ++i) {
      try {
        ids[i - c0] = tok.encode(docs[i].text);
        ids[i - c0].push_back(tok.eos_id());
      } catch (const std::exception& e) {
        errors[i - c0] = str(docs[i].source, ": ", e.what());
      }
    }
    for (const auto& e : errors) ZAYA_CHECK(e.empty(), e);
    for (int64_t i = c0; i < c1; ++i) {
      const auto& d = ids[i - c0];
      auto& counts = is_val[i] ? val_counts : train_counts;
      for (int32_t t : d) ++counts[static_cast<size_t>(t)];
      SplitStats& s = is_val[i] ? st.val : st.train;
      s.documents += 1;
      s.tokens += static_cast<int64_t>(d.size());
      (is_val[i] ? val_w : train_w).add_document(d);
    }
    if (o.progress && n > kChunk)
      log_info("data prepare: tokenized ", c1, "/", n, " documents, ", st.train.tokens + st.val.tokens,
               " tokens");
  }
  train_w.finalize();
  val_w.finalize();
  st.unigram_baseline = unigram_cross_entropy(train_counts, val_counts);

  // 4. Model, vocab and stats; then every output moves into place at once.
  {
    std::ofstream m(temps.add(model_path), std::ios::binary | std::ios::trunc);
    m.write(model_bytes.data(), static_cast<std::streamsize>(model_bytes.size()));
    m.flush();
    ZAYA_CHECK(m.good(), model_path, ": write failed");
  }
  tok.write_vocab(temps.add(vocab_path));
  st.total_seconds = seconds_since(t0);
  nlohmann::json j = {
      {"inputs", {{"files", st.input_files}, {"bytes", st.input_bytes}, {"invalid_utf8_bytes", st.invalid_utf8_bytes}}},
      {"doc_split", o.doc_split == DocSplit::file ? "file" : "paragraph"},
      {"tokenizer",
       {{"model", model_path},
        {"trained", o.vocab_size > 0},
        {"vocab_size", st.vocab_size},
        {"pad_id", tok.pad_id()},
        {"eos_id", tok.eos_id()},
        {"bos_id", tok.bos_id()},
        {"unk_id", tok.unk_id()},
        {"seconds", st.tokenizer_seconds}}},
      {"dtype", st.dtype},
      {"seed", o.seed},
      {"val_fraction", o.val_fraction},
      {"train", {{"prefix", train_prefix}, {"documents", st.train.documents}, {"tokens", st.train.tokens}}},
      {"val", {{"prefix", val_prefix}, {"documents", st.val.documents}, {"tokens", st.val.tokens}}},
      {"unigram_baseline_nats_per_token", st.unigram_baseline},
      {"seconds", st.total_seconds},
  };
  if (st.single_document_cut)
    j["single_document_cut"] = {{"source", st.cut_source}, {"byte", st.cut.byte}, {"line", st.cut.line}};
  {
    std::ofstream js(temps.add(o.out_prefix + ".json"), std::ios::trunc);
    js << j.dump(2) << "\n";
    js.flush();
    ZAYA_CHECK(js.good(), o.out_prefix, ".json: write failed");
  }
  temps.commit();
  return st;
}

}  // namespace zaya::data
