// zaya forward: run a ZAYA1 model on one token sequence and write the fp32 logits as .npy;
// optionally the loss and every parameter's gradient (for the HF parity test). The model comes from
// a zaya checkpoint or a transformers directory (--model) or from zaya's own init (--init-config +
// --seed). --save-hf re-exports it as a transformers directory (the export test); --bench-steps
// times training steps (forward + backward) on random tokens (benchmarks/model_vs_hf.py).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "zaya/ckpt/hf_io.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/core/philox.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"
#include "zaya/train/model_io.h"

namespace zaya::app {
namespace {

struct ForwardArgs {
  std::string model, init_config, ids, ids_file, out, grads_out, save_hf, save_hf_dtype = "f32", gemm_dtype = "f32";
  uint64_t seed = 0, save_hf_shard_bytes = 5'000'000'000ull;
  bool loss = false;
  int64_t bench_steps = 0, batch = 8, seq = 256;
  bool gemm_shapes = false, sections = false, bench_paced = false;
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

std::unique_ptr<model::ZayaModel> make_model(const ForwardArgs& a, int64_t B, int64_t T) {
  ZAYA_CHECK(a.model.empty() != a.init_config.empty(), "forward: give exactly one of --model and --init-config");
  if (!a.model.empty()) return train::load_model_source(a.model, B, T).model;
  ConfigReader reader = ConfigReader::from_file(a.init_config);
  auto m = std::make_unique<model::ZayaModel>(model::ModelConfig::from_toml(reader), B, T);
  m->init(a.seed);
  return m;
}

void apply_gemm_dtype(const ForwardArgs& a, model::ZayaModel& m) {
  ZAYA_CHECK(a.gemm_dtype == "f32" || a.gemm_dtype == "bf16", "--gemm-dtype: expected f32 or bf16, found '",
             a.gemm_dtype, "'");
  if (a.gemm_dtype == "bf16") m.set_gemm_dtype(DType::bf16);
}

// Times `steps` training steps (zero_grad, forward with the loss gradient, backward) on [B, T]
// random tokens after one untimed warm-up step; prints one line per phase and the throughput.
// Paced (--bench-paced): after the warm-up step the command prints "bench: ready" and then runs one
// timed step per line read from standard input, printing "bench: step K forward F ms backward B ms
// gemm G ms X GFLOP" after each; end of input ends the run early. benchmarks/model_vs_hf.py drives it to
// alternate single steps of zaya and transformers, so each pair is timed within a second on a
// machine whose speed drifts.
void run_bench(model::ZayaModel& m, int64_t steps, bool gemm_shapes, bool sections, bool paced) {
  using clock = std::chrono::steady_clock;
  const int64_t B = m.batch(), T = m.seq_len(), V = m.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), tg(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = 1 + static_cast<int32_t>(philox_uniform(12345, i) * static_cast<float>(V - 1)) % static_cast<int32_t>(V - 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) tg[b * T + t] = t + 1 < T ? ids[b * T + t + 1] : -100;
  Tensor tid = Tensor::borrow(ids.data(), Shape{B, T}, DType::i32);
  Tensor ttg = Tensor::borrow(tg.data(), Shape{B, T}, DType::i32);
  double fwd = 0, bwd = 0, loss = 0;
  ops::cpu::gemm_profile_shapes(gemm_shapes);
  m.time_sections(sections);
  for (int64_t s = -1; s < steps; ++s) {
    if (s == 0) {  // the warm-up step builds the GEMM primitives
      ops::cpu::gemm_time_reset();
      m.reset_section_times();
      if (paced) {
        std::printf("bench: ready\n");
        std::fflush(stdout);
      }
    }
    std::string go;
    if (paced && s >= 0 && !std::getline(std::cin, go)) {
      steps = s;  // the driver closed the pipe: the summary covers the steps run
      break;
    }
    const ops::cpu::GemmTimeStats gemm_before = ops::cpu::gemm_time_stats();
    m.zero_grad();
    auto t0 = clock::now();
    loss = m.forward(tid, ttg, true);
    auto t1 = clock::now();
    m.backward();
    auto t2 = clock::now();
    if (s >= 0) {
      const double f = std::chrono::duration<double>(t1 - t0).count(),
                   b = std::chrono::duration<double>(t2 - t1).count();
      fwd += f;
      bwd += b;
      if (paced) {
        const ops::cpu::GemmTimeStats g = ops::cpu::gemm_time_stats();
        std::printf("bench: step %lld forward %.3f ms backward %.3f ms gemm %.3f ms %.3f GFLOP\n",
                    static_cast<long long>(s + 1), 1e3 * f, 1e3 * b, 1e3 * (g.seconds - gemm_before.seconds),
                    1e-9 * (g.flops - gemm_before.flops));
        std::fflush(stdout);
      }
    }
  }
  ZAYA_CHECK(steps > 0, "forward --bench-paced: input ended before the first timed step");
  const double n = static_cast<double>(steps), step = (fwd + bwd) / n;
  std::printf("bench: batch %lld x %lld tokens, %lld steps, gemm %s, loss %.4f\n", static_cast<long long>(B),
              static_cast<long long>(T), static_cast<long long>(steps),
              m.gemm_dtype() == DType::bf16 ? "bf16" : "f32", loss);
  std::printf("bench: forward %.2f ms, backward %.2f ms, step %.2f ms\n", 1e3 * fwd / n, 1e3 * bwd / n, 1e3 * step);
  std::printf("bench: tokens/s %.1f\n", static_cast<double>(B * T) / step);
  // The GEMM floor: what the step would take if everything but the library GEMMs took no time.
  const ops::cpu::GemmTimeStats g = ops::cpu::gemm_time_stats();
  std::printf("bench: GEMMs %.2f ms per step (%lld calls, %.2f GFLOP at %.1f GFLOP/s), everything else %.2f ms\n",
              1e3 * g.seconds / n, static_cast<long long>(g.calls / steps), 1e-9 * g.flops / n,
              g.seconds > 0 ? 1e-9 * g.flops / g.seconds : 0.0, 1e3 * (step - g.seconds / n));
  if (g.side_by_side_calls > 0)
    std::printf("bench: grouped GEMM calls run side by side: %.1f per step, threads finishing %.3f ms apart per call\n",
                static_cast<double>(g.side_by_side_calls) / n,
                1e3 * g.side_by_side_gap_seconds / static_cast<double>(g.side_by_side_calls));
  if (gemm_shapes) {
    ops::cpu::gemm_profile_shapes(false);
    std::printf("bench: GEMM shapes (per step; op letters, M x N x K, ? = tokens per expert)\n");
    for (const ops::cpu::GemmShapeTime& r : ops::cpu::gemm_shape_times())
      std::printf("bench:   %-34s %4.1f calls %8.2f ms %7.3f GFLOP %6.1f GFLOP/s\n", r.shape.c_str(),
                  static_cast<double>(r.calls) / n, 1e3 * r.seconds / n, 1e-9 * r.flops / n,
                  r.seconds > 0 ? 1e-9 * r.flops / r.seconds : 0.0);
  }
  if (sections) {
    m.time_sections(false);
    double total = 0;
    for (const auto& r : m.section_times()) total += r.seconds;
    std::printf("bench: parts of the step (per step, GEMMs included; %.2f ms in all)\n", 1e3 * total / n);
    std::printf("bench:   %-62s %8s    %5s %8s %8s\n", "part", "time", "share", "GEMMs", "rest");
    for (const auto& r : m.section_times())
      std::printf("bench:   %-62s %8.2f ms %5.1f%% %8.2f %8.2f\n", r.name.c_str(), 1e3 * r.seconds / n,
                  total > 0 ? 100.0 * r.seconds / total : 0.0, 1e3 * r.gemm_seconds / n,
                  1e3 * (r.seconds - r.gemm_seconds) / n);
  }
  // The formula (docs/model.md) counts the layer input too, which the model keeps outside the
  // layer's saved block.
  const double saved = m.saved_bytes_per_token_per_layer();
  const double layer_input = 4.0 * static_cast<double>(m.config().hidden_size);
  std::printf(
      "bench: activation arena %.1f MiB (saved per token per layer %.0f B + layer input %.0f B = %.0f B; "
      "formula %lld B)\n",
      static_cast<double>(m.activation_bytes()) / (1 << 20), saved, layer_input, saved + layer_input,
      static_cast<long long>(model::activation_bytes_per_token_per_layer(m.config(), 4)));
}

int run_forward(const ForwardArgs& a) {
  ZAYA_CHECK(!a.bench_paced || a.bench_steps > 0,
             "forward: --bench-paced needs --bench-steps N (the most steps to run)");
  if (a.bench_steps > 0) {
    ZAYA_CHECK(a.ids.empty() && a.ids_file.empty() && a.out.empty() && a.grads_out.empty() && !a.loss,
               "forward: --bench-steps runs on random tokens; it takes no --ids/--ids-file/--out/--grads-out/--loss");
    auto m = make_model(a, a.batch, a.seq);
    apply_gemm_dtype(a, *m);
    run_bench(*m, a.bench_steps, a.gemm_shapes, a.sections, a.bench_paced);
    return 0;
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
  auto m = make_model(a, 1, T);
  if (!a.save_hf.empty()) {
    ZAYA_CHECK(a.save_hf_dtype == "f32" || a.save_hf_dtype == "bf16", "--save-hf-dtype: expected f32 or bf16, found '",
               a.save_hf_dtype, "'");
    // Exported before the forward: the files hold exactly the weights the logits below come from.
    ckpt::export_hf(*m, a.save_hf, a.save_hf_dtype == "bf16" ? DType::bf16 : DType::f32, a.save_hf_shard_bytes);
  }
  if (!run) return 0;
  apply_gemm_dtype(a, *m);
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
  auto* cmd = app.add_subcommand(
      "forward", "Run a ZAYA1 model (zaya checkpoint or transformers directory) on token ids");
  cmd->add_option(
      "--model", args->model,
      "zaya checkpoint (step dir, or run dir using `latest`) or transformers save_pretrained directory");
  cmd->add_option("--init-config", args->init_config, "instead of --model: a TOML run config ([model]) to init from");
  cmd->add_option("--seed", args->seed, "init seed with --init-config")->capture_default_str();
  cmd->add_option("--ids", args->ids, "comma-separated token ids");
  cmd->add_option("--ids-file", args->ids_file, "file of token ids (comma or whitespace separated)");
  cmd->add_option("--out", args->out, "write fp32 logits [tokens, vocab] as .npy");
  cmd->add_option("--grads-out", args->grads_out,
                  "run backward of the next-token loss and write every parameter gradient (safetensors)");
  cmd->add_flag("--loss", args->loss, "print the next-token cross-entropy");
  cmd->add_option("--save-hf", args->save_hf, "export the model as a transformers directory");
  cmd->add_option("--save-hf-dtype", args->save_hf_dtype, "f32 or bf16 (balancing biases stay f32)")
      ->capture_default_str();
  cmd->add_option("--save-hf-shard-bytes", args->save_hf_shard_bytes,
                  "shard the export (model-0000i-of-0000n + index.json) above this many bytes")
      ->capture_default_str();
  cmd->add_option("--gemm-dtype", args->gemm_dtype, "f32 or bf16 inputs for the expert and LM-head GEMMs")
      ->capture_default_str();
  cmd->add_option("--bench-steps", args->bench_steps, "time N training steps on random tokens and print tokens/s");
  cmd->add_flag(
      "--bench-paced", args->bench_paced,
      "with --bench-steps: after the warm-up, run one timed step per line read from stdin and print "
      "each step's times (benchmarks/model_vs_hf.py alternates zaya's and transformers' steps with it)");
  cmd->add_flag("--gemm-shapes", args->gemm_shapes, "with --bench-steps: time every GEMM shape of the step");
  cmd->add_flag("--sections", args->sections,
                "with --bench-steps: time each part of the step (each block's forward and backward, head, loss)");
  cmd->add_option("--batch", args->batch, "batch rows for --bench-steps")->capture_default_str();
  cmd->add_option("--seq", args->seq, "sequence length for --bench-steps")->capture_default_str();
  commands.push_back({cmd, [args] { return run_forward(*args); }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(forward, zaya::app::add_forward);
