// zaya forward: run a transformers-format ZAYA1 directory on one token sequence and write the fp32
// logits as .npy; optionally the loss and every parameter's gradient (for the HF parity test).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "zaya/ckpt/hf_io.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"
#include "zaya/model/zaya_model.h"

namespace zaya::app {
namespace {

struct ForwardArgs {
  std::string model, ids, ids_file, out, grads_out;
  bool loss = false;
};

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::string tok;
  std::istringstream in(text);
  auto flush = [&] {
    if (tok.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ZAYA_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, what, ": '", tok,
               "' is not a token id (expected a non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
    tok.clear();
  };
  for (char c; in.get(c);) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') flush();
    else tok += c;
  }
  flush();
  ZAYA_CHECK(!ids.empty(), what, ": no token ids");
  return ids;
}

// NumPy format v1.0: magic, version, u16 header length, a Python dict literal padded with spaces
// and a newline so that the data starts on a 64-byte boundary.
void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "), }";
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  dict += std::string(pad, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  ZAYA_CHECK(out.good(), "cannot open ", path, " for writing");
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t hl = static_cast<uint16_t>(dict.size());
  char hb[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.write(hb, 2);
  out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(rows * cols * 4));
  ZAYA_CHECK(out.good(), "write failed: ", path);
}

int run_forward(const ForwardArgs& a) {
  ZAYA_CHECK(a.ids.empty() != a.ids_file.empty(), "forward: give exactly one of --ids and --ids-file");
  std::vector<int32_t> ids;
  if (!a.ids.empty()) {
    ids = parse_ids(a.ids, "--ids");
  } else {
    std::ifstream in(a.ids_file);
    ZAYA_CHECK(in.good(), "cannot open --ids-file ", a.ids_file);
    std::ostringstream s;
    s << in.rdbuf();
    ids = parse_ids(s.str(), a.ids_file);
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  auto m = ckpt::load_hf_model(a.model, 1, T);
  Tensor tid = Tensor::borrow(ids.data(), Shape{1, T}, DType::i32);
  if (!a.out.empty()) {
    Tensor logits = Tensor::empty(Shape{T, m->config().vocab_size}, DType::f32);
    m->forward_logits(tid, logits);
    write_npy_f32(a.out, logits.data<float>(), T, m->config().vocab_size);
  }
  if (a.loss || !a.grads_out.empty()) {
    // Next-token targets: position t predicts ids[t+1]; the last position has no target.
    std::vector<int32_t> tg(ids.begin() + 1, ids.end());
    tg.push_back(-100);
    Tensor ttg = Tensor::borrow(tg.data(), Shape{1, T}, DType::i32);
    bool grads = !a.grads_out.empty();
    double loss = m->forward(tid, ttg, grads);
    if (a.loss) std::printf("loss %.9g\n", loss);
    std::fflush(stdout);
    if (grads) {
      m->backward();
      std::vector<ckpt::StEntry> entries;
      for (size_t i = 0; i < m->specs().size(); ++i)
        entries.push_back(ckpt::st_entry(m->specs()[i].name, m->grad(static_cast<int>(i))));
      ckpt::write_safetensors(a.grads_out, entries, {{"format", "pt"}}, false);
    }
  }
  std::fprintf(stderr, "forward: %lld tokens, activation arena %.1f MiB\n", static_cast<long long>(T),
               static_cast<double>(m->activation_bytes()) / (1 << 20));
  return 0;
}

void add_forward(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<ForwardArgs>();
  auto* cmd = app.add_subcommand("forward", "Run a ZAYA1 model (transformers directory) on token ids");
  cmd->add_option("--model", args->model, "transformers save_pretrained directory")->required();
  cmd->add_option("--ids", args->ids, "comma-separated token ids");
  cmd->add_option("--ids-file", args->ids_file, "file of token ids (comma or whitespace separated)");
  cmd->add_option("--out", args->out, "write fp32 logits [tokens, vocab] as .npy");
  cmd->add_option("--grads-out", args->grads_out,
                  "run backward of the next-token loss and write every parameter gradient (safetensors)");
  cmd->add_flag("--loss", args->loss, "print the next-token cross-entropy");
  commands.push_back({cmd, [args] { return run_forward(*args); }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(forward, zaya::app::add_forward);
