// `zaya bench step`: times training steps (zero_grad, forward with the loss gradient, backward) of
// a ZAYA1 model on random tokens; benchmarks/model_vs_hf.py, tools/step_ab.py and
// scripts/gpu_check.sh parse its "bench: ..." lines.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_vocabulary.h"
#include "commands.h"
#include "model_source.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/philox.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"

namespace zaya::app {
namespace {

struct BenchStepFlags {
  ModelSource source;
  int64_t steps = 0, batch = 8, seq = 256;
  bool gemm_shapes = false, sections = false, paced = false, recompute = false;
};

// This process's peak resident memory (getrusage's maximum resident set, KiB on Linux): parameters,
// gradients and the activation pages the steps touched.
double peak_rss_mib() {
  struct rusage u {};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<double>(u.ru_maxrss) / 1024.0 : 0.0;
}

// Times `steps` training steps (zero_grad, forward with the loss gradient, backward) on [B, T]
// random tokens after one untimed warm-up step; prints one line per phase and the throughput.
// Paced (--paced): after the warm-up step the command prints "bench: ready" and then runs one
// timed step per line read from standard input, printing "bench: step K forward F ms backward B ms
// gemm G ms X GFLOP" after each; end of input ends the run early. benchmarks/model_vs_hf.py drives it to
// alternate single steps of zaya and transformers, so each pair is timed within a second on a
// machine whose speed drifts.
void run_bench(model::ZayaModel& m, int64_t steps, bool gemm_shapes, bool sections, bool paced) {
  using clock = std::chrono::steady_clock;
  const int64_t B = m.batch(), T = m.seq_len(), V = m.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), tg(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = 1 + static_cast<int32_t>(philox_uniform(12345, i) * static_cast<float>(V - 1)) %
                     static_cast<int32_t>(V - 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) tg[b * T + t] = t + 1 < T ? ids[b * T + t + 1] : -100;
  const bool gpu = m.device() != Device::cpu;
  Tensor tid = Tensor::borrow(ids.data(), Shape{B, T}, DType::i32).to(m.device());
  Tensor ttg = Tensor::borrow(tg.data(), Shape{B, T}, DType::i32).to(m.device());
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
    if (gpu) cuda::synchronize();  // kernels run asynchronously: the step ends when the device is done
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
  ZAYA_CHECK(steps > 0, "bench step --paced: input ended before the first timed step");
  const double n = static_cast<double>(steps), step = (fwd + bwd) / n;
  std::printf("bench: batch %lld x %lld tokens, %lld steps, gemm %s, loss %.4f, recompute %s\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(steps),
              m.gemm_dtype() == DType::bf16 ? "bf16" : "f32", loss, m.recompute() ? "on" : "off");
  std::printf("bench: forward %.2f ms, backward %.2f ms, step %.2f ms\n", 1e3 * fwd / n, 1e3 * bwd / n,
              1e3 * step);
  std::printf("bench: tokens/s %.1f\n", static_cast<double>(B * T) / step);
  if (gpu) return;  // the GEMM clock, the sections and the arena formula below are the CPU's
  // The GEMM floor: what the step would take if everything but the library GEMMs took no time.
  const ops::cpu::GemmTimeStats g = ops::cpu::gemm_time_stats();
  std::printf(
      "bench: GEMMs %.2f ms per step (%lld calls, %.2f GFLOP at %.1f GFLOP/s), everything else %.2f ms\n",
      1e3 * g.seconds / n, static_cast<long long>(g.calls / steps), 1e-9 * g.flops / n,
      g.seconds > 0 ? 1e-9 * g.flops / g.seconds : 0.0, 1e3 * (step - g.seconds / n));
  if (g.side_by_side_calls > 0)
    std::printf(
        "bench: grouped GEMM calls run side by side: %.1f per step, threads finishing %.3f ms apart per "
        "call\n",
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
  if (m.recompute())
    std::printf("bench: recompute: each layer keeps %.0f B per token besides its input; one shared set of %.0f B\n",
                m.kept_bytes_per_token_per_layer(), saved);
  std::printf("bench: memory: activation arena %.1f MiB, peak RSS %.1f MiB\n",
              static_cast<double>(m.activation_bytes()) / (1 << 20), peak_rss_mib());
}

}  // namespace

void add_bench_step(CLI::App& bench, Commands& commands) {
  auto f = std::make_shared<BenchStepFlags>();
  auto* cmd = bench.add_subcommand(
      "step",
      "Time training steps (forward + backward) of a ZAYA1 model on random tokens: tokens/s, GEMMs, memory");
  cmd->add_option(
      "--model,--ckpt", f->source.model,
      "zaya checkpoint (step dir, or run dir using `latest`) or transformers save_pretrained directory");
  cmd->add_option("--init-config", f->source.init_config,
                  "instead of --model: a TOML run config ([model]) to init from");
  cmd->add_option("--seed", f->source.seed, "init seed with --init-config")->capture_default_str();
  cmd->add_option("--gemm-dtype", f->source.gemm_dtype,
                  "f32 or bf16 inputs for the weight GEMMs (experts, projections, LM head)")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  cmd->add_option("--device", f->source.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--steps", f->steps, "timed steps after one untimed warm-up step (with --paced: the most)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", f->batch, "batch rows")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seq", f->seq, "sequence length")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--paced", f->paced,
                "after the warm-up, run one timed step per line read from stdin and print each step's times "
                "(benchmarks/model_vs_hf.py alternates zaya's and transformers' steps with it)");
  cmd->add_flag("--recompute", f->recompute,
                "recompute each layer's activations in the backward from its input (ZayaModel::set_recompute): "
                "about one layer's saved activations instead of all, for L - 1 more layer forwards");
  cmd->add_flag("--gemm-shapes", f->gemm_shapes, "also time every GEMM shape of the step");
  cmd->add_flag("--sections", f->sections,
                "also time each part of the step (each block's forward and backward, head, loss)");
  commands.push_back({cmd, [f] {
                        auto m = make_model(f->source, f->batch, f->seq, "bench step");
                        apply_gemm_dtype(f->source, *m);
                        m->set_recompute(f->recompute);
                        run_bench(*m, f->steps, f->gemm_shapes, f->sections, f->paced);
                        return 0;
                      }});
}

}  // namespace zaya::app
