// zaya forward: run a ZAYA1 model on one token sequence and write the fp32 logits as .npy;
// optionally the loss and every parameter's gradient (for the HF parity test). The model comes from
// a zaya checkpoint or a transformers directory (--model) or from zaya's own init (--init-config +
// --seed). --save-hf re-exports it as a transformers directory (the export test). Timing training
// steps is `zaya bench step` (apps/cmd_bench_step.cc).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_vocabulary.h"
#include "commands.h"
#include "model_source.h"
#include "zaya/ckpt/hf_io.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"
#include "zaya/model/zaya_model.h"

namespace zaya::app {
namespace {

struct ForwardArgs {
  ModelSource source;
  std::string ids, ids_file, out, grads_out, save_hf, save_hf_dtype = "f32";
  uint64_t save_hf_shard_bytes = 5'000'000'000ull;
  bool loss = false;
  std::vector<std::string> moved;  // benchmark flags given to forward (now `zaya bench step`'s)
};

// forward's former benchmark flags and their names under `zaya bench step`.
constexpr std::pair<const char*, const char*> kMovedFlags[] = {
    {"--bench-steps", "--steps"}, {"--bench-paced", "--paced"}, {"--gemm-shapes", "--gemm-shapes"},
    {"--sections", "--sections"}, {"--batch", "--batch"},       {"--seq", "--seq"}};

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
  if (!a.moved.empty()) {
    std::string as;
    for (const auto& [old_name, new_name] : kMovedFlags)
      if (a.moved.front() == old_name) as = new_name;
    throw Error(str("forward: ", a.moved.front(), " moved to `zaya bench step` (as ", as,
                    "); forward only runs the model on --ids. Timing training steps: zaya bench step "
                    "--init-config CFG --steps N [--batch B] [--seq T] [--paced] [--gemm-shapes] "
                    "[--sections]"));
  }
  const bool run = !a.ids.empty() || !a.ids_file.empty();
  ZAYA_CHECK(a.ids.empty() || a.ids_file.empty(), "forward: give at most one of --ids and --ids-file");
  ZAYA_CHECK(run || !a.save_hf.empty(), "forward: give --ids or --ids-file (or only --save-hf to re-export)");
  ZAYA_CHECK(run || (a.out.empty() && a.grads_out.empty() && !a.loss),
             "forward: --out, --grads-out and --loss need --ids or --ids-file");
  std::vector<int32_t> ids{0};
  if (!a.ids.empty()) {
    ids = parse_ids(a.ids, "--ids");
  } else if (!a.ids_file.empty()) {
    std::ifstream in(a.ids_file);
    ZAYA_CHECK(in.good(), "cannot open --ids-file ", a.ids_file);
    std::ostringstream s;
    s << in.rdbuf();
    ids = parse_ids(s.str(), a.ids_file);
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  // One id has no next id to predict: the loss would be a mean over no targets.
  ZAYA_CHECK(!(a.loss || !a.grads_out.empty()) || T >= 2, "forward: --loss and --grads-out need at least 2 ids (",
             "each position predicts the next id), found ", T);
  auto m = make_model(a.source, 1, T, "forward");
  if (!a.save_hf.empty()) {
    ZAYA_CHECK(a.save_hf_dtype == "f32" || a.save_hf_dtype == "bf16", "--save-hf-dtype: expected f32 or bf16, found '",
               a.save_hf_dtype, "'");
    // Exported before the forward: the files hold exactly the weights the logits below come from.
    ckpt::export_hf(*m, a.save_hf, a.save_hf_dtype == "bf16" ? DType::bf16 : DType::f32, a.save_hf_shard_bytes);
  }
  if (!run) return 0;
  apply_gemm_dtype(a.source, *m);
  const Device dev = m->device();
  Tensor tid = Tensor::borrow(ids.data(), Shape{1, T}, DType::i32).to(dev);
  if (!a.out.empty()) {
    Tensor logits = Tensor::empty(Shape{T, m->config().vocab_size}, DType::f32, dev);
    m->forward_logits(tid, logits);
    const Tensor host = logits.to(Device::cpu);
    write_npy_f32(a.out, host.data<float>(), T, m->config().vocab_size);
  }
  if (a.loss || !a.grads_out.empty()) {
    // Next-token targets: position t predicts ids[t+1]; the last position has no target.
    std::vector<int32_t> tg(ids.begin() + 1, ids.end());
    tg.push_back(-100);
    Tensor ttg = Tensor::borrow(tg.data(), Shape{1, T}, DType::i32).to(dev);
    bool grads = !a.grads_out.empty();
    double loss = m->forward(tid, ttg, grads);
    if (a.loss) std::printf("loss %.9g\n", loss);
    std::fflush(stdout);
    if (grads) {
      m->backward();
      std::vector<ckpt::StEntry> entries;
      std::vector<Tensor> host(m->specs().size());  // the gradients on the host, alive until written
      for (size_t i = 0; i < m->specs().size(); ++i) {
        host[i] = m->grad(static_cast<int>(i)).to(Device::cpu);
        entries.push_back(ckpt::st_entry(m->specs()[i].name, host[i]));
      }
      ckpt::write_safetensors(a.grads_out, entries, {{"format", "pt"}}, false);
    }
  }
  std::fprintf(stderr, "forward: %lld tokens, activation arena %.1f MiB\n", static_cast<long long>(T),
               static_cast<double>(m->activation_bytes()) / (1 << 20));
  return 0;
}

void add_forward(CLI::App& app, Commands& commands) {
  auto args = std::make_shared<ForwardArgs>();
  auto* cmd = app.add_subcommand(
      "forward", "Run a ZAYA1 model (zaya checkpoint or transformers directory) on token ids");
  cmd->add_option(
      "--model,--ckpt", args->source.model,
      "zaya checkpoint (step dir, or run dir using `latest`) or transformers save_pretrained directory");
  cmd->add_option("--init-config", args->source.init_config, "instead of --model: a TOML run config ([model]) to init from");
  cmd->add_option("--seed", args->source.seed, "init seed with --init-config")->capture_default_str();
  cmd->add_option("--ids", args->ids, "comma-separated token ids");
  cmd->add_option("--ids-file", args->ids_file, "file of token ids (comma or whitespace separated)");
  cmd->add_option("--out", args->out, "write f32 logits [tokens, vocab] as .npy (nothing is written without it)");
  cmd->add_option("--grads-out", args->grads_out,
                  "run backward of the next-token loss and write every parameter gradient (safetensors)");
  cmd->add_flag("--loss", args->loss, "print the next-token cross-entropy");
  cmd->add_option("--save-hf", args->save_hf, "export the model as a transformers directory");
  cmd->add_option("--save-hf-dtype", args->save_hf_dtype, "f32 or bf16 (balancing biases stay f32)")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  cmd->add_option("--save-hf-shard-bytes", args->save_hf_shard_bytes,
                  "shard the export (model-0000i-of-0000n + index.json) above this many bytes")
      ->capture_default_str();
  cmd->add_option("--device", args->source.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--gemm-dtype", args->source.gemm_dtype,
                  "f32 or bf16 inputs for the weight GEMMs (experts, projections, LM head)")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  // The benchmark flags forward used to take: accepted (hidden) only to say where they went.
  for (const auto& [old_name, new_name] : kMovedFlags) {
    const std::string name = old_name;
    const auto note = [args, name] { args->moved.push_back(name); };
    const bool takes_value = name == "--bench-steps" || name == "--batch" || name == "--seq";
    auto* o = takes_value ? cmd->add_option_function<std::string>(name, [note](const std::string&) { note(); })
                          : cmd->add_flag_callback(name, note);
    o->group("");
  }
  commands.push_back({cmd, [args] { return run_forward(*args); }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(forward, zaya::app::add_forward);
